"""Money in whole nano-units (1e-9 of the currency): the one exact integer
form of an amount, for vectorised sums and splits (allocation, reports)
and for the gateway's spend accounts (Redis counts integers). Amounts are
Decimal at every boundary; converting is exact and rounds once."""

from __future__ import annotations

import math
from decimal import Decimal

NANO = 10**9  # nano-units in one unit of the currency
NANO_PLACES = Decimal("0.000000001")


def to_nano(amount: Decimal, *, up: bool = False) -> int:
    """`amount` as integer nano-units: rounded half-even, or up with `up`
    (a worst case held against a limit must never round below it)."""
    scaled = Decimal(amount).scaleb(9)  # exact: the point moved
    return math.ceil(scaled) if up else round(scaled)  # round(): half to even


def from_nano(nano: int) -> Decimal:
    return (Decimal(int(nano)) / NANO).quantize(NANO_PLACES)
