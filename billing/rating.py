"""Rating: a tenant's usage over a period, priced. Reads hourly rollups
(never raw events), the price book in force for the tenant's tier in each
hour, its reservations and dedicated GPUs, and its plan; returns charge
lines in exact Decimal, unrounded (an invoice rounds each line once).

Graduated tiers count the period's volume from its start, whichever book
priced the earlier tokens, so a price change mid-month keeps the volume."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Q, Sum

from billing.choices import TokenKind
from billing.models import ModelPrice, PriceBook
from billing.periods import subscription_at
from metering.models import UsageRollup
from serving.choices import PoolKind
from serving.models import Gpu, Reservation
from tenants.models import Tenant

MILLION = Decimal(1_000_000)
HOUR = timedelta(hours=1)


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


def charges_rate(
    *, tenant: Tenant, start: datetime, end: datetime, warnings: list[str] | None = None
) -> list[Charge]:
    """The period's charges; what could not be priced is appended to
    `warnings` (usage of a model no book in force prices is not billed)."""
    books = _books(tenant=tenant, start=start, end=end)
    unpriced: set[str] = set()
    usage = _charges_usage(tenant=tenant, start=start, end=end, books=books, unpriced=unpriced)
    if warnings is not None:
        warnings.extend(f"usage of {name} has no price: not billed" for name in sorted(unpriced))
    fees = _charges_reservations(tenant=tenant, start=start, end=end, books=books)
    fees += _charges_dedicated(tenant=tenant, start=start, end=end, books=books)
    return usage + fees + _charges_plan(tenant=tenant, start=start, usage=usage, fees=fees)


class Books:
    """The price book in force in each hour for one tenant's tier."""

    def __init__(self, books: list[PriceBook], prices: dict[tuple[int, int], ModelPrice]):
        self.books = books
        self.prices = prices

    def at(self, moment: datetime) -> PriceBook | None:
        live = [
            b
            for b in self.books
            if b.effective_from <= moment and (b.effective_to is None or moment < b.effective_to)
        ]
        # A tier's own book over an all-tiers one; the newest version first.
        live.sort(key=lambda b: (b.tier != "", b.version), reverse=True)
        return live[0] if live else None

    def price(self, book: PriceBook, model_id: int) -> ModelPrice | None:
        return self.prices.get((book.pk, model_id))

    def label(self, book_id: int) -> str:
        book = next(b for b in self.books if b.pk == book_id)
        return f"{book.name} v{book.version}"


def _books(*, tenant: Tenant, start: datetime, end: datetime) -> Books:
    books = list(
        PriceBook.objects.filter(Q(tier=tenant.tier) | Q(tier=""), effective_from__lt=end)
        .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=start))
        .order_by("effective_from")
    )
    prices = {
        (p.book_id, p.served_model_id): p
        for p in ModelPrice.objects.filter(book__in=books)
        .select_related("served_model")
        .prefetch_related("tiers")
    }
    return Books(books, prices)


def _charges_usage(*, tenant, start, end, books: Books, unpriced: set[str]) -> list[Charge]:
    rows = (
        UsageRollup.objects.filter(
            tenant=tenant, hour__gte=start, hour__lt=end, served_model__isnull=False
        )
        .values("hour", "served_model_id", "served_model__name")
        .annotate(
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            completion=Sum("completion_tokens"),
            seconds=Sum("device_seconds"),
        )
        .order_by("hour")
    )
    volume: dict[tuple[int, str], int] = defaultdict(int)  # the period's tokens so far
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for row in rows:
        book = books.at(row["hour"])
        price = books.price(book, row["served_model_id"]) if book else None
        if price is None:
            unpriced.add(row["served_model__name"])
            continue
        counts = {
            TokenKind.INPUT: row["prompt"] - row["cached"],
            TokenKind.CACHED_INPUT: row["cached"],
            TokenKind.OUTPUT: row["completion"],
        }
        for kind, tokens in counts.items():
            done = volume[(row["served_model_id"], kind)]
            for quantity, per_mtok in _graduated(price, kind, done, tokens):
                line = lines[("tokens", row["served_model__name"], kind, book.pk, per_mtok)]
                line[0] += quantity
                line[1] += quantity * per_mtok / MILLION
            volume[(row["served_model_id"], kind)] = done + tokens
        if price.per_gpu_second is not None and row["seconds"]:
            line = lines[
                ("gpu_seconds", row["served_model__name"], None, book.pk, price.per_gpu_second)
            ]
            line[0] += row["seconds"]
            line[1] += row["seconds"] * price.per_gpu_second
    return [
        Charge(
            kind=kind,
            description=(
                f"{model}: {token_kind.replace('_', ' ')} tokens"
                if token_kind
                else f"{model}: GPU-seconds"
            ),
            quantity=quantity,
            unit_price=unit,
            amount=amount,
            model=model,
            token_kind=token_kind,
            book=books.label(book_id),
        )
        for (kind, model, token_kind, book_id, unit), (quantity, amount) in lines.items()
        if quantity
    ]


def _graduated(price: ModelPrice, kind: str, done: int, tokens: int):
    """(tokens, price per million) pieces of `tokens` more, after `done`."""
    tiers = [t for t in price.tiers.all() if t.kind == kind]
    if not tiers:
        yield Decimal(tokens), price.per_mtok(kind)
        return
    bounds = [t.from_tokens for t in tiers[1:]] + [None]
    position, left = done, tokens
    for tier, upto in zip(tiers, bounds, strict=True):
        if left <= 0:
            return
        if upto is not None and position >= upto:
            continue
        take = left if upto is None else min(left, upto - max(position, tier.from_tokens))
        if take > 0:
            yield Decimal(take), tier.per_mtok
            position += take
            left -= take


def _charges_reservations(*, tenant, start, end, books: Books) -> list[Charge]:
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for reservation in Reservation.objects.filter(tenant=tenant, start__lt=end, end__gt=start):
        for hour, share in _hours(max(start, reservation.start), min(end, reservation.end)):
            book = books.at(hour)
            if book is None or not book.reservation_per_gpu_hour:
                continue
            gpu_hours = share * reservation.gpu_count
            line = lines[(book.pk, book.reservation_per_gpu_hour)]
            line[0] += gpu_hours
            line[1] += gpu_hours * book.reservation_per_gpu_hour
    return [
        Charge("reservation", "Reserved GPUs", q, unit, amount, book=books.label(book_id))
        for (book_id, unit), (q, amount) in lines.items()
    ]


def _charges_dedicated(*, tenant, start, end, books: Books) -> list[Charge]:
    gpus = (
        Gpu.objects.filter(replicas__pool__owner=tenant, replicas__pool__kind=PoolKind.DEDICATED)
        .distinct()
        .count()
    )
    if not gpus:
        return []
    # Hours summed per (book, month) first, divided once: exact for whole months.
    hours: dict[tuple, Decimal] = defaultdict(Decimal)
    for hour, share in _hours(start, end):
        book = books.at(hour)
        if book is not None and book.dedicated_per_gpu_month:
            hours[(book.pk, book.dedicated_per_gpu_month, _hours_in_month(hour))] += share
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for (book_id, unit, month_hours), used in hours.items():
        line = lines[(book_id, unit)]
        line[0] += used * gpus / month_hours
        line[1] += used * gpus * unit / month_hours
    return [
        Charge(
            "dedicated", "Dedicated GPUs (GPU-months)", q, unit, amount, book=books.label(book_id)
        )
        for (book_id, unit), (q, amount) in lines.items()
    ]


def _charges_plan(*, tenant, start, usage: list[Charge], fees: list[Charge]) -> list[Charge]:
    subscription = subscription_at(tenant=tenant, moment=start)
    if subscription is None:
        return []
    plan = subscription.plan
    out = []
    used = sum((c.amount for c in usage), Decimal(0))
    if plan.discount_percent:
        discount = -used * plan.discount_percent / 100
        out.append(
            Charge(
                "discount",
                f"{plan.name}: {plan.discount_percent}% off usage",
                Decimal(1),
                None,
                discount,
            )
        )
    total = used + sum((c.amount for c in fees + out), Decimal(0))
    if total < plan.minimum_commit:
        out.append(
            Charge(
                "commit_true_up",
                f"{plan.name}: minimum commitment {plan.minimum_commit}",
                Decimal(1),
                None,
                plan.minimum_commit - total,
            )
        )
    return out


def _hours(start: datetime, end: datetime):
    """(hour start, share of that hour inside [start, end)) for every hour
    the span touches."""
    hour = start.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    while hour < end:
        inside = min(end, hour + HOUR) - max(start, hour)
        yield hour, Decimal(inside.total_seconds()) / 3600
        hour += HOUR


def _hours_in_month(moment: datetime) -> Decimal:
    first = moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (first + timedelta(days=32)).replace(day=1)
    return Decimal((following - first).total_seconds()) / 3600
