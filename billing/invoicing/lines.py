"""Charges as invoice lines: each line rounded once to the currency's minor
units (half-even, billing.money.LINE_ROUNDING). A line's key says which
lines of two ratings of the same period are the same line.

How a line reads (`line_quantity_text`, `line_unit_price_text`,
`line_text`) is decided here once, for the invoice page, its download,
its print and the Stripe item alike: quantities grouped with their unit
and rounded for display only (tokens whole, GPU-seconds to 0.1, GPU-hours
to 0.01, GPU-months to 0.001), unit prices exact with the currency and
what they are per ("0.60 USD / 1M tokens")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, fields, replace
from datetime import datetime
from decimal import ROUND_HALF_EVEN, Decimal

from billing.choices import LineKind
from billing.money import from_minor, price_format, to_minor, unit_price_kept
from billing.pricing.rating import Charge

LineKey = tuple[str, str, str, str, Decimal | None]


@dataclass(frozen=True)
class LineDraft:
    kind: str
    description: str
    quantity: Decimal
    unit_price: Decimal | None
    amount: Decimal
    amount_minor: int
    service_start: datetime
    service_end: datetime
    model: str = ""
    token_kind: str = ""
    book: str = ""
    late: bool = False
    sla_metric: str = ""
    # Set by billing.tax.rules.lines_taxed, once the invoice's tax is decided.
    tax_rate_id: int | None = None
    tax_percent: Decimal | None = None
    tax_minor: int = 0

    def as_fields(self) -> dict:
        """The InvoiceLine fields (shallow: asdict() would deep-copy)."""
        return {name: getattr(self, name) for name in _FIELDS}

    @property
    def key(self) -> LineKey:
        return (self.kind, self.model, self.token_kind, self.book, self.unit_price)


_FIELDS = [f.name for f in fields(LineDraft)]


def lines_from_charges(
    charges: Iterable[Charge], *, currency: str, start: datetime, end: datetime
) -> list[LineDraft]:
    return [
        LineDraft(
            kind=c.kind,
            description=c.description,
            quantity=c.quantity,
            # As the line keeps it, so its key is the same when re-rated.
            unit_price=unit_price_kept(c.unit_price),
            amount=c.amount,
            amount_minor=to_minor(c.amount, currency),
            service_start=start,
            service_end=end,
            model=c.model or "",
            token_kind=c.token_kind or "",
            book=c.book or "",
        )
        for c in charges
    ]


def lines_total_minor(charges: Iterable[Charge], *, currency: str) -> int:
    """What these charges come to as invoice lines: each rounded once, then
    summed (what a page beside an invoice's figures must show too)."""
    return sum(to_minor(c.amount, currency) for c in charges)


def line_difference(*, rated: LineDraft | None, billed: LineDraft | None) -> LineDraft | None:
    """What a period's line owes now beyond what was billed for it, as a
    late-usage line; None when nothing changed."""
    base = rated or billed
    assert base is not None
    zero = Decimal(0)
    quantity = (rated.quantity if rated else zero) - (billed.quantity if billed else zero)
    amount = (rated.amount if rated else zero) - (billed.amount if billed else zero)
    minor = (rated.amount_minor if rated else 0) - (billed.amount_minor if billed else 0)
    if not quantity and not minor:
        return None
    return replace(
        base,
        description=f"Late usage {base.service_start:%Y-%m-%d} to {base.service_end:%Y-%m-%d}: "
        f"{base.description}",
        quantity=quantity,
        amount=amount,
        amount_minor=minor,
        late=True,
    )


def credit_line(*, grant, minor: int, currency: str, start: datetime, end: datetime) -> LineDraft:
    note = f" ({grant.note})" if grant.note else ""
    return LineDraft(
        kind=LineKind.CREDIT,
        description=f"Prepaid credit #{grant.pk}{note}",
        quantity=Decimal(1),
        unit_price=None,
        amount=-from_minor(minor, currency),
        amount_minor=-minor,
        service_start=start,
        service_end=end,
    )


@dataclass(frozen=True)
class LineUnit:
    """What a line's quantity counts and its unit price is per."""

    quantity: str  # "tokens"
    places: int  # decimal places a quantity is shown with
    per: str  # "1M tokens"


# Kinds not here (discount, true-up, credits) are one amount: no quantity or unit price.
LINE_UNITS = {
    LineKind.TOKENS: LineUnit("tokens", 0, "1M tokens"),
    LineKind.GPU_SECONDS: LineUnit("GPU-seconds", 1, "GPU-second"),
    LineKind.RESERVATION: LineUnit("GPU-hours", 2, "GPU-hour"),
    LineKind.DEDICATED: LineUnit("GPU-months", 3, "GPU-month"),
}


def line_quantity_text(line) -> str:
    """The quantity with its unit: "1,553,065,625 tokens", "12,345.7
    GPU-seconds"; "" for a line that is one amount. Rounded half-even for
    display; the amount was computed from the exact quantity."""
    unit = LINE_UNITS.get(line.kind)
    if unit is None or line.quantity is None:
        return ""
    shown = Decimal(line.quantity).quantize(Decimal(1).scaleb(-unit.places), ROUND_HALF_EVEN)
    return f"{shown:,f} {unit.quantity}"


def line_unit_price_text(line, *, currency: str) -> str:
    """The unit price, exact, with what it is per: "0.60 USD / 1M tokens";
    "" when the line has none."""
    unit = LINE_UNITS.get(line.kind)
    if unit is None or line.unit_price is None:
        return ""
    return f"{price_format(line.unit_price, currency)} / {unit.per}"


def line_text(line, *, currency: str) -> str:
    """The line in one sentence, for where only a description fits (a
    Stripe invoice item): "tiny-llama: output tokens, tier 2 (above 10M):
    1,553,065,625 tokens at 0.60 USD / 1M tokens"."""
    quantity = line_quantity_text(line)
    price = line_unit_price_text(line, currency=currency)
    if not quantity:
        return line.description
    return f"{line.description}: {quantity}" + (f" at {price}" if price else "")
