"""Bulk, idempotent inserts through PostgreSQL's COPY: rows are copied into a
per-connection temporary staging table, then moved with INSERT ... ON
CONFLICT DO NOTHING, all in one transaction. A row whose key exists already
is skipped, not an error. Far less Python per row than the ORM's
bulk_create, which matters on hot paths (the gateway's record sink, the
usage ledger)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from django.db import connection, transaction
from psycopg import sql


def copy_insert_ignoring_conflicts(
    *, table: str, columns: Sequence[str], rows: Iterable[Sequence], conflict: Sequence[str]
) -> int:
    """Insert `rows` (tuples in `columns` order) into `table`; rows whose
    `conflict` columns already exist are skipped. Returns rows inserted."""
    # Only the copied columns, no constraints; named by the column set so two
    # callers with different columns never share a staging table.
    digest = hashlib.sha1(",".join(columns).encode()).hexdigest()[:8]  # noqa: S324 (a name)
    staging = sql.Identifier(f"_staging_{table}_{digest}")
    target = sql.Identifier(table)
    cols = sql.SQL(", ").join(map(sql.Identifier, columns))
    # wrap_database_errors: psycopg's errors surface as Django's (IntegrityError,
    # OperationalError, ...), which is what callers classify retries by.
    with transaction.atomic(), connection.cursor() as cursor, connection.wrap_database_errors:
        raw = cursor.cursor  # the psycopg cursor, for COPY
        raw.execute(
            sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {} ON COMMIT DELETE ROWS "
                "AS SELECT {} FROM {} WITH NO DATA"
            ).format(staging, cols, target)
        )
        with raw.copy(sql.SQL("COPY {} ({}) FROM STDIN").format(staging, cols)) as copy:
            for row in rows:
                copy.write_row(row)
        # Django's foreign keys are deferred: check them at this statement, so a
        # bad row fails here even inside a caller's larger transaction.
        raw.execute("SET CONSTRAINTS ALL IMMEDIATE")
        raw.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} ON CONFLICT ({}) DO NOTHING").format(
                target, cols, cols, staging, sql.SQL(", ").join(map(sql.Identifier, conflict))
            )
        )
        return raw.rowcount
