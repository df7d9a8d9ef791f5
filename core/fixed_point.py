"""Numbers as text in exports: plain fixed-point, never scientific.

`str(Decimal("0.000000000"))` is "0E-9" and `str(Decimal("0.00000015"))`
is "1.5E-7"; a float's repr is "1.5e-07". Spreadsheets, FOCUS readers and
people read neither as the amount they are, so every CSV and JSON export
writes numbers through `fixed_point` (CSV rows through core.csv_stream,
API bodies through `FixedPointJSONRenderer`, stored report JSON by the
writer that builds it)."""

from __future__ import annotations

import math
from decimal import Decimal

from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder


def fixed_point(value: Decimal | float | int | None) -> str:
    """`value` in plain fixed-point ("0.000000000", "0.00000015", "1000"),
    keeping a Decimal's places; minus zero is zero; None, NaN and infinities
    (no amount) are "". Floats are written from their shortest repr, so
    0.1 stays "0.1"."""
    if value is None or isinstance(value, bool):
        return "" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        value = Decimal(repr(value))
    elif not isinstance(value, Decimal):
        return str(value)
    if not value.is_finite():
        return ""
    if value.is_zero():
        value = abs(value)  # "-0.00" is not an amount anyone owes
    return format(value, "f")


class _ApiEncoder(JSONEncoder):
    def default(self, obj):
        if isinstance(obj, Decimal):
            return fixed_point(obj)
        return super().default(obj)


class FixedPointJSONRenderer(JSONRenderer):
    """DRF's JSON renderer, but a Decimal that reaches it unserialized (a
    dict built by a view, a JSONField's value) is a fixed-point string.
    DRF's own DecimalField already writes fixed-point."""

    encoder_class = _ApiEncoder
