"""Query results as pandas frames without a Python object per row: the
server folds the whole result into one CSV text value (string_agg), which
arrives as one message and goes through pandas' C parser. Row by row,
psycopg spends seconds on a million rows (one message, one wait each)."""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence

import pandas as pd
from django.db import connection

NULLABLE = ("Int64", "Float64", "boolean")


def query_frame(
    query: str, params: Sequence | None, dtypes: Mapping[str, object], *, raw=None
) -> pd.DataFrame:
    """Run `query`, whose columns are named as `dtypes`' keys, and return its
    rows typed as `dtypes` says. A `str` column is quoted as a CSV field; a
    nullable extension type ("Int64") reads NULL as missing. `raw`: a psycopg
    connection to use instead of Django's (from another thread: psycopg
    serialises statements on a connection, and it is the same session)."""
    fields = ", ".join(
        f"""'"' || replace(q.{name}::text, '"', '""') || '"'"""
        if dtype is str
        else f"coalesce(q.{name}::text, '')"
        for name, dtype in dtypes.items()
    )
    wrapped = f"SELECT string_agg(concat_ws(',', {fields}), E'\\n') FROM ({query}) AS q"  # noqa: S608
    with raw.cursor() if raw is not None else connection.cursor() as cursor:
        cursor.execute(wrapped, params)
        text = cursor.fetchone()[0] or ""
    nullable = [name for name, dtype in dtypes.items() if dtype in NULLABLE]
    if not text:
        return pd.DataFrame({name: pd.Series(dtype=dtype) for name, dtype in dtypes.items()})
    return pd.read_csv(
        io.StringIO(text),
        names=list(dtypes),
        dtype=dict(dtypes),
        keep_default_na=False,
        na_values={name: [""] for name in nullable},
    )
