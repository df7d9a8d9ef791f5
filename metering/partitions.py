"""Monthly partitions of the usage ledger (PostgreSQL declarative
partitioning). Created ahead by a daily task and on demand by ingestion for
any month a batch touches, so an insert never finds its partition missing."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime

from django.db import connection
from psycopg import sql

from core.calendar import month_start, months_add
from core.locks import advisory_xact_lock

LEDGER_TABLE = "metering_usageevent"


def partition_name(month: date) -> str:
    return f"{LEDGER_TABLE}_y{month.year:04d}m{month.month:02d}"


def usage_partitions_ensure(*, months: Iterable[date | datetime]) -> list[str]:
    """Create the partitions for `months` that do not exist yet; returns the
    names created. Safe to call concurrently and repeatedly."""
    created = []
    for start in sorted({month_start(m) for m in months}):
        name = partition_name(start)
        end = months_add(start, 1)
        with connection.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s)", [name])
            if cursor.fetchone()[0] is not None:
                continue
        # Two writers may reach a new month together; IF NOT EXISTS does not
        # make concurrent CREATEs safe, a lock does.
        with advisory_xact_lock(LEDGER_TABLE), connection.cursor() as cursor:
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
    return usage_partitions_ensure(
        months=[months_add(month, n) for n in range(-1, months_ahead + 1)]
    )


def usage_partitions_list() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = %s::regclass ORDER BY c.relname",
            [LEDGER_TABLE],
        )
        return [row[0] for row in cursor.fetchall()]
