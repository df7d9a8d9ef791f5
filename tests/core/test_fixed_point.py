"""Numbers in exports are plain fixed-point text: never "0E-9", "1.5E-7",
"1e-07" or "1E+3", and minus zero is zero."""

from __future__ import annotations

from decimal import Decimal

import pytest

from core.csv_stream import csv_lines
from core.fixed_point import FixedPointJSONRenderer, fixed_point


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Decimal("0E-9"), "0.000000000"),
        (Decimal("-0E-9"), "0.000000000"),
        (Decimal("-0.00"), "0.00"),
        (Decimal("1.5E-7"), "0.00000015"),
        (Decimal("1.50E-7"), "0.000000150"),
        (Decimal("1E+3"), "1000"),
        (Decimal("-12.340"), "-12.340"),
        (1.5e-07, "0.00000015"),
        (1e16, "10000000000000000"),
        (0.1, "0.1"),
        (-0.0, "0.0"),
        (float("nan"), ""),
        (Decimal("NaN"), ""),
        (None, ""),
        (7, "7"),
    ],
)
def test_fixed_point(value, text):
    assert fixed_point(value) == text


def test_csv_rows_write_decimals_and_floats_in_fixed_point():
    rows = [{"a": Decimal("0E-9"), "b": 1.5e-07, "c": 3, "d": "text"}]
    assert list(csv_lines(rows, ["a", "b", "c", "d"]))[1] == "0.000000000,0.00000015,3,text\r\n"


def test_api_json_writes_a_raw_decimal_in_fixed_point():
    body = FixedPointJSONRenderer().render({"zero": Decimal("0E-9"), "big": Decimal("1E+3")})
    assert body == b'{"zero":"0.000000000","big":"1000"}'
