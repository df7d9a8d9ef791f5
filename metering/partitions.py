"""Monthly partitions of the usage ledger (PostgreSQL declarative
partitioning). Created ahead by a daily task and on demand by ingestion for
any month a batch touches, so an insert never finds its partition missing."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, date, datetime

from django.db import connection, transaction
from psycopg import sql

LEDGER_TABLE = "metering_usageevent"


def month_start(value: date | datetime) -> date:
    return date(value.year, value.month, 1)


def _next_month(month: date) -> date:
    return date(month.year + (month.month == 12), month.month % 12 + 1, 1)


def _previous_month(month: date) -> date:
    return date(month.year - (month.month == 1), (month.month - 2) % 12 + 1, 1)


def partition_name(month: date) -> str:
    return f"{LEDGER_TABLE}_y{month.year:04d}m{month.month:02d}"


def usage_partitions_ensure(*, months: Iterable[date | datetime]) -> list[str]:
    """Create the partitions for `months` that do not exist yet; returns the
    names created. Safe to call concurrently and repeatedly."""
    created = []
    for month in sorted({month_start(m) for m in months}):
        name = partition_name(month)
        start = datetime(month.year, month.month, 1, tzinfo=UTC)
        end_month = _next_month(month)
        end = datetime(end_month.year, end_month.month, 1, tzinfo=UTC)
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s)", [name])
            if cursor.fetchone()[0] is not None:
                continue
        with transaction.atomic(), connection.cursor() as cursor:
            # Two writers may reach a new month together; IF NOT EXISTS does
            # not make concurrent CREATEs safe, a lock does.
            cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [LEDGER_TABLE])
            # pg_class itself, not to_regclass(): the relation cache may not
            # have seen the other writer's commit yet.
            cursor.execute(
                "SELECT 1 FROM pg_class WHERE relname = %s "
                "AND relnamespace = current_schema()::regnamespace",
                [name],
            )
            if cursor.fetchone() is None:
                cursor.execute(
                    sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                        sql.Identifier(name),
                        sql.Identifier(LEDGER_TABLE),
                        sql.Literal(start),
                        sql.Literal(end),
                    )
                )
                created.append(name)
    return created


def usage_partitions_ensure_ahead(*, now: datetime, months_ahead: int = 3) -> list[str]:
    """This month, the previous one (late usage) and `months_ahead` more."""
    month = month_start(now)
    months = [_previous_month(month), month]
    for _ in range(months_ahead):
        months.append(_next_month(months[-1]))
    return usage_partitions_ensure(months=months)


def usage_partitions_list() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            [LEDGER_TABLE],
        )
        return [row[0] for row in cursor.fetchall()]
