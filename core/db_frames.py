"""Query results as pandas frames without a Python object per row: the
server writes the result as CSV (`COPY (query) TO STDOUT`), the bytes
stream into one buffer and go through pandas' C parser. No single value
holds the whole result, so there is no size limit (a text aggregate stops
at 1 GB), and the session is free again before parsing starts."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import pandas as pd
from django.db import connection
from pandas.api.types import is_bool_dtype

NULLABLE = ("Int64", "Float64", "boolean")


def query_frame(
    query: str, params: Sequence | None, dtypes: Mapping[str, object], *, raw=None
) -> pd.DataFrame:
    """Run `query`, whose columns are named as `dtypes`' keys, and return its
    rows typed as `dtypes` says. A `str` column reads NULL as ""; a nullable
    extension type ("Int64") reads NULL as missing. `raw`: a psycopg
    connection to use instead of Django's (from another thread: psycopg
    serialises statements on a connection, and it is the same session)."""
    buffer = _query_csv(query, params, dtypes, raw=raw)
    if not buffer.getbuffer().nbytes:
        return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})
    nullable = [name for name, dtype in dtypes.items() if dtype in NULLABLE]
    return pd.read_csv(
        buffer,
        names=list(dtypes),
        dtype=dict(dtypes),
        keep_default_na=False,
        na_values={name: [""] for name in nullable},
    )


def _query_csv(
    query: str, params: Sequence | None, dtypes: Mapping[str, object], *, raw
) -> io.BytesIO:
    """The rows of `query` as CSV bytes, columns in `dtypes`' order."""
    # COPY writes booleans as t/f; their text cast is the true/false pandas reads.
    columns = ", ".join(
        f"q.{name}::text" if dtype is not str and is_bool_dtype(dtype) else f"q.{name}"
        for name, dtype in dtypes.items()
    )
    statement = f"COPY (SELECT {columns} FROM ({query}) AS q) TO STDOUT (FORMAT CSV)"  # noqa: S608
    buffer = io.BytesIO()
    if raw is not None:
        with raw.cursor() as cursor:
            _copy_out(cursor, statement, params, into=buffer)
    else:
        with connection.cursor() as cursor, connection.wrap_database_errors:
            _copy_out(cursor.cursor, statement, params, into=buffer)
    buffer.seek(0)
    return buffer


def _copy_out(cursor, statement: str, params: Sequence | None, *, into: io.BytesIO) -> None:
    with cursor.copy(statement, params) as copy:
        for chunk in copy:
            into.write(chunk)
