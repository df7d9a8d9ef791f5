"""One request's money, for the request trace page: what it was charged
(its tokens and GPU-seconds priced by rating's own price lookup and rate
card, in the tenant's billing currency), its part of the hour's allocated
GPU cost (in the cost's currency), and the invoice lines it fed.

Pricing one request: a flat price is exact. Under graduated volume tiers
no single request has an exact price (rating prices the period's tokens,
not requests), so a request is apportioned as the period's last tokens:
after the rest of the period's volume of its model and token kind (to date
while the period runs), at the tier that volume reached, as `card_pieces`
walks it. The parts are exact and unrounded; invoices round per line only.

Cost: allocation books one row per tenant, model, pool and hour, and
splits a shared pool's cost by attributed device-seconds, so the request's
part of each hour is its device-seconds in that hour / the row's
device-seconds x the row's total (idle share included)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING

from django.db.models import Q, Sum

from billing.choices import LineKind, TokenKind
from billing.invoicing.selectors import invoice_list
from billing.models import CostAllocation, Invoice, InvoiceLine, PoolHourCost
from billing.pricing.periods import tenant_period
from billing.pricing.rate_card import MILLION, card_pieces, usage_amount, usage_counts
from billing.pricing.rating import price_books, rating_inputs, rating_session
from core.nanos import NANO_PLACES
from metering.selectors.requests import request_billed_tokens
from tenants.models import Tenant
from tenants.selectors import tier_timelines

if TYPE_CHECKING:  # a row the metering selectors hand over; billing queries no ledger table
    from metering.models import UsageEvent

GPU_SECONDS = "gpu_seconds"


def _hour(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


@dataclass(frozen=True)
class ChargePart:
    """One priced part of a request: `quantity` tokens of `kind` at
    `unit_price` per million (from the tier starting at `tier_from`, None
    for a flat price), or GPU-seconds at `unit_price` per GPU-second."""

    kind: str  # a TokenKind, or GPU_SECONDS
    label: str
    quantity: Decimal
    unit_price: Decimal
    amount: Decimal
    tier_from: int | None = None

    @property
    def per_million(self) -> bool:
        return self.kind != GPU_SECONDS


@dataclass(frozen=True)
class RequestCharge:
    """What one request was charged, exact, in `currency`; `parts` empty
    and `unpriced` set when no book in force prices its model."""

    currency: str
    period_start: datetime
    period_end: datetime
    tokens: dict[str, int]  # by token kind, as rating counts them
    book: str = ""
    parts: tuple[ChargePart, ...] = ()
    total: Decimal = Decimal(0)
    graduated: bool = False
    unpriced: str = ""


def request_charge(
    *,
    tenant: Tenant | None,
    event: UsageEvent,
    device_seconds: Decimal,
    events: list[UsageEvent] | None = None,
) -> RequestCharge:
    """The request's charge, priced where rating prices its hour: the book
    in force for the tenant's tier at the request's hour, its rate card for
    the model, GPU-seconds if the card charges them. Before the plan's
    discount and any minimum-commitment true-up (invoice-wide lines).
    `events`: the request's rows, when read already."""
    customer = event.tenant
    start, end = tenant_period(tenant=customer, moment=event.received_at)
    billed = request_billed_tokens(tenant=tenant, request_id=event.request_id, events=events)
    counts = usage_counts(**billed)
    base = RequestCharge(
        currency=customer.billing_currency, period_start=start, period_end=end, tokens=counts
    )
    with rating_session():
        tiers = tier_timelines([customer.pk]).get(customer.pk)
        books = price_books(
            tier=customer.tier,
            tiers=tiers,
            currency=customer.billing_currency,
            start=start,
            end=end,
        )
        book = books.at(_hour(event.received_at))
        card = books.card(book, event.served_model_id) if book else None
        if card is None:
            tier = books.tier_at(_hour(event.received_at))
            why = f"no price book in force for tier {tier} prices {event.model} then"
            return replace(base, unpriced=why)
        graduated = card.flat is None
        done = {kind: 0 for kind in counts}
        if graduated:  # the rest of the period's volume of this model comes first
            inputs = rating_inputs(tenants=[customer], start=start, end=end)[customer.pk]
            for _, model_id, _, prompt, cached, completion, _, _ in inputs.usage:
                if model_id == event.served_model_id:
                    rolled = usage_counts(prompt=prompt, cached=cached, completion=completion)
                    for kind, tokens in rolled.items():
                        done[kind] += tokens
            done = {kind: max(done[kind] - counts[kind], 0) for kind in counts}
    parts = []
    for kind, tokens in counts.items():
        position = done[kind]
        for quantity, per_mtok in card_pieces(card, kind, position, tokens):
            tier_from = None
            if graduated:
                tier_from = max((s for s, _ in card.steps[kind] if s <= position), default=0)
            parts.append(
                ChargePart(
                    kind=kind,
                    label=TokenKind(kind).label,
                    quantity=quantity,
                    unit_price=per_mtok,
                    amount=quantity * per_mtok / MILLION,
                    tier_from=tier_from,
                )
            )
            position += int(quantity)
    gpu_seconds = device_seconds if card.per_gpu_second is not None else Decimal(0)
    if gpu_seconds:
        parts.append(
            ChargePart(
                kind=GPU_SECONDS,
                label="GPU-seconds",
                quantity=gpu_seconds,
                unit_price=card.per_gpu_second,
                amount=gpu_seconds * card.per_gpu_second,
            )
        )
    total = usage_amount(
        card,
        done=done,
        prompt=billed["prompt"],
        cached=billed["cached"],
        completion=billed["completion"],
        gpu_seconds=gpu_seconds,
    )
    return replace(
        base,
        book=books.label(book.pk),
        parts=tuple(parts),
        total=total,
        graduated=graduated,
    )


@dataclass(frozen=True)
class CostHour:
    """The request's part of one hour's allocated cost: its device-seconds
    then, of `seconds` booked to its tenant, model and pool carrying
    `allocated` (in `currency`)."""

    hour: datetime
    device_seconds: Decimal
    seconds: Decimal
    allocated: Decimal
    currency: str
    share: Decimal


@dataclass(frozen=True)
class RequestCost:
    hours: tuple[CostHour, ...]
    currency: str  # "" when its hours were booked in different currencies
    share: Decimal | None  # summed over hours, where they share a currency
    unallocated: tuple[datetime, ...]  # hours it used that are not allocated yet


def request_cost_share(
    *, event: UsageEvent, windows: dict[datetime, Decimal] | list[tuple[datetime, Decimal]]
) -> RequestCost:
    """The request's part of its pool's allocated cost, hour by hour
    (platform finance staff only: cost is not shown to tenants)."""
    by_hour: dict[datetime, Decimal] = {}
    for start, seconds in dict(windows).items():
        by_hour[_hour(start)] = by_hour.get(_hour(start), Decimal(0)) + seconds
    hours, missing = [], []
    for hour, seconds in sorted(by_hour.items()):
        booked = CostAllocation.objects.filter(
            scenario=None,
            hour=hour,
            tenant_id=event.tenant_id,
            pool_id=event.pool_id,
            served_model_id=event.served_model_id,
        ).aggregate(total=Sum("total"), seconds=Sum("device_seconds"))
        pool_hour = PoolHourCost.objects.filter(scenario=None, hour=hour, pool_id=event.pool_id)
        currency = pool_hour.values_list("currency", flat=True).first()
        if booked["total"] is None or not booked["seconds"] or currency is None:
            missing.append(hour)
            continue
        share = (booked["total"] * seconds / booked["seconds"]).quantize(NANO_PLACES)
        hours.append(CostHour(hour, seconds, booked["seconds"], booked["total"], currency, share))
    currencies = {h.currency for h in hours}
    one = currencies.pop() if len(currencies) == 1 else ""
    share = sum((h.share for h in hours), Decimal(0)) if one else None
    return RequestCost(tuple(hours), one, share, tuple(missing))


def request_invoice(*, tenant: Tenant | None, event: UsageEvent) -> Invoice | None:
    """The invoice whose period contains the request (a tenant sees only
    issued ones)."""
    return (
        invoice_list(tenant=tenant)
        .filter(
            tenant_id=event.tenant_id,
            period_start__lte=event.received_at,
            period_end__gt=event.received_at,
        )
        .first()
    )


def request_invoice_lines(
    *, invoice: Invoice | None, event: UsageEvent, charge: RequestCharge, device_seconds: Decimal
) -> list[InvoiceLine]:
    """Only the lines the request fed: its model's lines of the token kinds
    it had (and GPU-seconds, if it used any) covering its hour. Not fixed
    fees, other models, discounts or late adjustments of other periods."""
    if invoice is None:
        return []
    hour = _hour(event.received_at)
    kinds = [kind for kind, tokens in charge.tokens.items() if tokens]
    fed = Q(kind=LineKind.TOKENS, token_kind__in=kinds)
    if device_seconds:
        fed |= Q(kind=LineKind.GPU_SECONDS)
    lines = InvoiceLine.objects.filter(
        fed,
        invoice=invoice,
        model=event.served_model.name if event.served_model_id else event.model,
        service_start__lte=hour,
        service_end__gt=hour,
    )
    return list(lines.order_by("position"))
