"""One line of what a tenant owes, as rating computes it (billing.pricing.rating)
and the invoice's lines are made from (billing.invoicing.lines)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class Charge:
    """One line of what a tenant owes: `quantity` units at `unit_price`
    (per million tokens, per GPU-second, per GPU-hour, per GPU-month)."""

    kind: str  # tokens | gpu_seconds | reservation | dedicated | discount | commit_true_up
    description: str
    quantity: Decimal
    unit_price: Decimal | None
    amount: Decimal
    model: str | None = None
    token_kind: str | None = None
    book: str | None = None
