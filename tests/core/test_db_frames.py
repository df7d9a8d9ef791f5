"""Query results read as typed frames through COPY: every type reads back
as it was, NULLs become missing values (or "" in a text column), and a
result of many megabytes arrives whole."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from django.db import connection

from core.db_frames import query_frame

pytestmark = pytest.mark.django_db

MIXED = """
    SELECT * FROM (VALUES
        (1::bigint, 10::bigint, 'plain'::text, true, 1.5::float8),
        (2, NULL, 'a, "quoted"' || E'\\n' || 'two-line value', false, NULL),
        (3, -7, '', NULL, -0.25)
    ) AS v (id, maybe, label, flag, ratio)
    WHERE id >= %s
"""
MIXED_TYPES = {
    "id": np.int64,
    "maybe": "Int64",
    "label": str,
    "flag": "boolean",
    "ratio": "Float64",
}


def test_every_type_reads_back_as_it_was():
    frame = query_frame(MIXED, [1], MIXED_TYPES)

    assert list(frame.columns) == list(MIXED_TYPES)
    assert frame["id"].dtype == np.int64
    assert frame["id"].tolist() == [1, 2, 3]
    assert frame["maybe"].dtype == "Int64"
    assert frame["maybe"].tolist() == [10, pd.NA, -7]
    assert frame["label"].tolist() == ["plain", 'a, "quoted"\ntwo-line value', ""]
    assert frame["flag"].dtype == "boolean"
    assert frame["flag"].tolist() == [True, False, pd.NA]
    assert frame["ratio"].tolist() == [1.5, pd.NA, -0.25]


def test_parameters_bind_and_an_empty_result_keeps_its_types():
    assert query_frame(MIXED, [3], MIXED_TYPES)["id"].tolist() == [3]

    empty = query_frame(MIXED, [4], MIXED_TYPES)

    assert empty.empty
    assert list(empty.columns) == list(MIXED_TYPES)
    assert empty.dtypes.tolist() == query_frame(MIXED, [1], MIXED_TYPES).dtypes.tolist()


def test_a_raw_psycopg_connection_reads_the_same():
    connection.ensure_connection()

    frame = query_frame(MIXED, [1], MIXED_TYPES, raw=connection.connection)

    pd.testing.assert_frame_equal(frame, query_frame(MIXED, [1], MIXED_TYPES))


def test_a_frame_of_many_megabytes_reads_whole():
    rows = 200_000
    frame = query_frame(
        """
        SELECT g AS id, g * 1000003 AS big, nullif(g %% 7, 0) AS sparse,
               'request-' || md5(g::text) AS request_id
        FROM generate_series(1::bigint, %s) AS g
        """,
        [rows],
        {"id": np.int64, "big": np.int64, "sparse": "Int64", "request_id": str},
    )

    assert frame["request_id"].str.len().sum() == 8_000_000  # bytes of text alone
    assert len(frame) == rows
    assert frame["id"].tolist() == list(range(1, rows + 1))
    assert int(frame["big"].sum()) == 1000003 * rows * (rows + 1) // 2
    assert int(frame["sparse"].isna().sum()) == rows // 7
    assert frame["request_id"].iloc[-1].startswith("request-")
    assert frame["request_id"].nunique() == rows


def test_an_error_part_way_through_the_rows_raises_and_the_session_goes_on():
    """The server fails after sending rows (division by zero at row 50,000):
    the read raises Django's DataError, nothing half-read comes back, and
    the same connection answers the next query."""
    from django.db import DataError, transaction

    failing = "SELECT 1 / (g - 50000) AS x FROM generate_series(1, 100000) AS g"
    with pytest.raises(DataError, match="division by zero"), transaction.atomic():
        query_frame(failing, None, {"x": np.int64})
    frame = query_frame("SELECT g AS x FROM generate_series(1, 3) AS g", None, {"x": np.int64})
    assert frame["x"].tolist() == [1, 2, 3]


def test_a_bad_query_raises_before_any_row():
    from django.db import ProgrammingError, transaction

    with pytest.raises(ProgrammingError, match="no_such_table"), transaction.atomic():
        query_frame("SELECT x FROM no_such_table", None, {"x": np.int64})
