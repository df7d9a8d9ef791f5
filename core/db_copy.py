"""Bulk writes through PostgreSQL's COPY: rows go into a per-connection
temporary staging table shaped like the target, from which one INSERT ...
SELECT moves them (typically with ON CONFLICT DO NOTHING). Far less Python
per row than the ORM's bulk_create, which matters on hot paths (the usage
ledger, attribution results)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from contextlib import contextmanager

from django.db import connection
from psycopg import sql

# A statement that changes nothing but is not a read: Django's execute
# wrappers (the audit trail's actor, audit.context) see a write coming
# before a COPY, which goes around them.
_WRITE_AHEAD = "DO $$ BEGIN END $$"


def copy_to_staging(
    raw,
    *,
    table: str,
    columns: Sequence[str],
    rows: Iterable[Sequence],
    types: Sequence[str] | None = None,
) -> str:
    """COPY `rows` (tuples in `columns` order) into an empty temporary table
    with `table`'s column types; returns its (quoted) name. The staging
    table empties itself at commit, so call this inside a transaction.
    `raw` is a psycopg cursor (Django's `cursor.cursor`). With the columns'
    PostgreSQL `types`, rows travel in COPY's binary format (about twice as
    fast: nothing is formatted as text and parsed back)."""
    # Only the copied columns, no constraints; named by the column set so two
    # callers with different columns never share a staging table.
    digest = hashlib.sha1(",".join(columns).encode()).hexdigest()[:8]  # noqa: S324 (a name)
    staging = sql.Identifier(f"_staging_{table}_{digest}")
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    raw.execute(
        sql.SQL(
            "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS "
            "AS SELECT {} FROM {} WITH NO DATA"
        ).format(staging, cols, sql.Identifier(table))
    )
    raw.execute(sql.SQL("TRUNCATE {}").format(staging))
    _copy(raw, staging, columns, rows, types)
    return staging.as_string(raw.connection)


def copy_into(raw, *, table: str, columns: Sequence[str], rows: Iterable[Sequence], types) -> int:
    """COPY `rows` (tuples in `columns` order, Python values psycopg dumps:
    Decimal, str, datetime...) straight into `table`, in binary; returns
    how many. For rows that need no conflict handling: each is inserted, its
    table's constraints and triggers checked as for an INSERT. Far cheaper
    than bulk_create, which prepares every field of every row in Python."""
    return _copy(raw, sql.Identifier(table), columns, rows, types)


def model_copy_columns(model, connection) -> tuple[list[str], list[str]]:
    """A model's columns but its automatic primary key, and their
    PostgreSQL types as COPY's binary format names them (no modifiers)."""
    fields = [f for f in model._meta.concrete_fields if not f.primary_key]
    return [f.column for f in fields], _copy_types(fields, connection)


def _copy_types(fields, connection) -> list[str]:
    return [f.db_type(connection).split("(")[0].strip() for f in fields]


def instances_create(model, instances: Sequence, connection) -> None:
    """bulk_create by binary COPY: new `instances` of `model` (an automatic
    key) written in one COPY, their keys drawn from its sequence first and
    set on them, each field prepared as bulk_create prepares it (`pre_save`
    for auto_now_add, `get_db_prep_save`), each row checked by the table's
    constraints and triggers as an INSERT's is. No SQL is composed per row:
    bulk_create's client-side binding of every value was most of its time
    for a run's invoices (profiled). No signals, as bulk_create."""
    if not instances:
        return
    meta = model._meta
    fields = [meta.pk, *(f for f in meta.concrete_fields if not f.primary_key)]
    types = _copy_types(fields, connection)
    with connection.cursor() as cursor, connection.wrap_database_errors:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)",
            [meta.db_table, meta.pk.column, len(instances)],
        )
        for instance, (pk,) in zip(instances, cursor.fetchall(), strict=True):
            instance.pk = pk
        rows = (
            [
                f.get_db_prep_save(f.pre_save(instance, True), connection)  # add: True
                for f in fields
            ]
            for instance in instances
        )
        _copy(cursor.cursor, sql.Identifier(meta.db_table), [f.column for f in fields], rows, types)
    for instance in instances:
        instance._state.adding = False
        instance._state.db = connection.alias


@contextmanager
def copy_writer(raw, *, table: str, columns: Sequence[str], types: Sequence[str]):
    """A binary COPY into `table` open for rows as they come (`write_row`):
    PostgreSQL takes in each buffer while the caller makes the next rows.
    An exception inside the block aborts the COPY."""
    with _copy_open(raw, sql.Identifier(table), columns, types) as copy:
        yield copy


@contextmanager
def _copy_open(raw, target: sql.Composable, columns: Sequence[str], types):
    with connection.cursor() as announcing:
        announcing.execute(_WRITE_AHEAD)
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    binary = sql.SQL(" (FORMAT BINARY)" if types else "")
    with raw.copy(sql.SQL("COPY {} ({}) FROM STDIN{}").format(target, cols, binary)) as copy:
        if types:
            copy.set_types(list(types))
        yield copy


def _copy(raw, target: sql.Composable, columns: Sequence[str], rows, types) -> int:
    count = 0
    with _copy_open(raw, target, columns, types) as copy:
        for row in rows:
            copy.write_row(row)
            count += 1
    return count
