"""Price floors: the lowest price per million tokens at which a tier's
model reaches a target margin over the forecast month. Pure arithmetic
in Decimal on what planning.plan gathers: the month's forecast tokens by
kind, its cost (planning.costs), the fees the tier earns regardless of
tokens (reservations, dedicated GPUs), and today's prices.

Today's ratios between kinds are held: every kind's price is today's
times one factor k, so revenue(k) = k x R + F, where R is the month's
token revenue at today's prices and F the fees. The target margin m
holds where revenue - cost = m x revenue, so k = (cost / (1 - m) - F) / R.
Each floor is rounded up to the cent: a floor never misses the target by
rounding."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

from core.nanos import NANO

KINDS = ("input", "cached", "output")
MILLION = Decimal(1_000_000)
CENT = Decimal("0.01")


@dataclass(frozen=True)
class Prices:
    """Per million tokens of each kind: prompt not read from cache, cached
    prompt, completion."""

    input: Decimal
    cached: Decimal
    output: Decimal

    def of(self, kind: str) -> Decimal:
        return getattr(self, kind)

    def scaled(self, factor: Decimal) -> Prices:
        return Prices(
            *(
                (self.of(kind) * factor).quantize(CENT, rounding=ROUND_CEILING)
                if factor > 0
                else Decimal(0)
                for kind in KINDS
            )
        )


@dataclass(frozen=True)
class Floor:
    floor: Prices | None
    revenue: Decimal  # the month's forecast revenue at today's prices (tokens + fees)
    cost: Decimal
    margin_percent: Decimal | None  # at today's prices; None without revenue
    note: str


def token_revenue(tokens: dict[str, int], prices: Prices) -> Decimal:
    return sum((Decimal(int(tokens.get(k, 0))) * prices.of(k) / MILLION for k in KINDS), Decimal(0))


def price_floor(
    *,
    tokens: dict[str, int],
    cost_nano: int,
    fees_nano: int,
    today: Prices,
    target_percent: Decimal,
) -> Floor:
    """`tokens`: the month's forecast by kind; `cost_nano`, `fees_nano`: its
    cost and its fees, nano-units; prices and the result in one currency."""
    cost = Decimal(int(cost_nano)) / NANO
    fees = Decimal(int(fees_nano)) / NANO
    tokens_at_today = token_revenue(tokens, today)
    revenue = tokens_at_today + fees
    margin = (
        ((revenue - cost) * 100 / revenue).quantize(Decimal("0.1"), rounding=ROUND_HALF_EVEN)
        if revenue
        else None
    )
    needed = cost / (1 - target_percent / 100)
    if not tokens_at_today:
        return Floor(
            None, revenue, cost, margin, "no token revenue to scale (no price or no demand)"
        )
    factor = (needed - fees) / tokens_at_today
    if factor <= 0:
        return Floor(today.scaled(Decimal(0)), revenue, cost, margin, "the fees alone reach it")
    return Floor(
        today.scaled(factor),
        revenue,
        cost,
        margin,
        f"today's prices x {factor.quantize(Decimal('0.0001'))}",
    )
