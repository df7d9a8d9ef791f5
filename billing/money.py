"""Money helpers. Amounts are Decimal at every boundary; inside vectorised
computations they are integers of nano-units (1e-9 of the currency), so
sums and splits are exact and nothing is ever a float amount of money."""

from __future__ import annotations

from decimal import ROUND_HALF_EVEN, Decimal

NANO = 10**9
NANO_PLACES = Decimal("0.000000001")
# Decimal fields that hold intermediate costs (invariant 1: at least 9 places).
COST = {"max_digits": 28, "decimal_places": 9}


def to_nano(amount: Decimal) -> int:
    """A Decimal amount as integer nano-units, rounded half-even once."""
    return int((Decimal(amount) * NANO).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


def from_nano(nano: int) -> Decimal:
    return (Decimal(int(nano)) / NANO).quantize(NANO_PLACES)
