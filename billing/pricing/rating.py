"""Rating: a tenant's usage over a period, priced. Reads hourly rollups
(never raw events), the price book in force for the tenant's tier in each
hour, its reservations and dedicated GPUs, and its plan; returns charge
lines in exact Decimal, unrounded (an invoice rounds each line once).

Graduated tiers count the period's volume from its start, whichever book
priced the earlier tokens, so a price change mid-month keeps the volume.

Currency (invariant 8). A tenant is rated in its billing currency: from a
book in that currency where its tier has one in force, else from the
book's prices converted at the period's average dated rate (the rate
margin reports convert revenue at, billing.fx), each such line
naming the rate. A plan's commitment is converted the same way. No rate
for the pair and a day of the period: FxRateMissingError, naming them;
never 1:1.

A model's prices in a book reduce to a `RateCard` (billing.pricing.rate_card:
plain data, no ORM), and its `card_pieces` is the one place tokens meet
prices: rating a period walks it line by line, and `usage_amount` prices
one request's usage after the period's volume so far (what the gateway
reserves and settles)."""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from itertools import pairwise

from django.db.models import Q, Sum
from django.utils import timezone

from billing.fx import FxConversion, fx_period_rate
from billing.models import ModelPrice, PriceBook, Subscription
from billing.pricing.charge import Charge
from billing.pricing.periods import subscriptions_at, subscriptions_during
from billing.pricing.plan_charges import charges_plan, charges_plans
from billing.pricing.rate_card import MILLION, RateCard, card_pieces, usage_counts
from core.calendar import month_hours, month_start, months_add
from metering.selectors.rating import usage_by_stretch
from serving.choices import PoolKind
from serving.gpu_shares import GPU_UNITS
from serving.models import ReplicaGpu, Reservation, ServedModel
from tenants.models import Tenant
from tenants.selectors import tier_at, tier_timelines


def tier_label(steps: tuple[tuple[int, Decimal], ...], index: int) -> str:
    """Which graduated tier of a kind's steps a line is, as an invoice
    reads it: "tier 1 (first 10M)", "tier 2 (10M to 50M)", "tier 3
    (above 50M)"; "" for a flat price (one step: no tiers)."""
    if len(steps) < 2:
        return ""
    start = steps[index][0]
    if index + 1 == len(steps):
        span = f"above {_tokens_short(start)}"
    elif start == 0:
        span = f"first {_tokens_short(steps[index + 1][0])}"
    else:
        span = f"{_tokens_short(start)} to {_tokens_short(steps[index + 1][0])}"
    return f"tier {index + 1} ({span})"


def _tokens_short(tokens: int) -> str:
    """10M, 1.5M, 500k, 1,234: a tier boundary as price lists write it."""
    if tokens >= 1_000_000 and tokens % 1_000 == 0:
        return f"{(Decimal(tokens) / 1_000_000).normalize():,f}M"
    if tokens >= 1_000 and tokens % 100 == 0:
        return f"{(Decimal(tokens) / 1_000).normalize():,f}k"
    return f"{tokens:,}"


@dataclass
class TenantInputs:
    """What rating reads for one tenant and period, loaded in bulk for many
    tenants at once (`rating_inputs`): usage summed per stretch of
    unchanging prices and model, reservations, dedicated GPUs, plan."""

    usage: list[tuple] = field(default_factory=list)  # (from, model id, name, p, c, o, s, n)
    reservations: list[tuple[datetime, datetime, int]] = field(default_factory=list)
    dedicated_gpus: Decimal = Decimal(0)  # GPU units / GPU_UNITS
    subscription: Subscription | None = None  # in force at the period's start
    # ((from, subscription), ...) for a tenant whose plan changed inside the period.
    plans: tuple = ()
    tiers: tuple = ()  # ((since, tier), ...) for a tenant that moved tiers

    def fingerprint(self) -> dict[str, int | str]:
        """Totals of the rated usage: the same usage rates the same."""
        totals = [0, 0, 0, Decimal(0), 0]
        for _, _, _, prompt, cached, completion, seconds, rows in self.usage:
            for n, value in enumerate((prompt, cached, completion, seconds, rows)):
                totals[n] += value
        prompt, cached, completion, seconds, rows = totals
        return {
            "prompt": prompt,
            "cached": cached,
            "completion": completion,
            "device_seconds": str(Decimal(seconds).normalize()),
            "rows": rows,
        }


def charges_compute(
    *,
    tenant: Tenant,
    start: datetime,
    end: datetime,
    inputs: TenantInputs,
    warnings: list[str] | None = None,
    used_from: dict[datetime, Decimal] | None = None,
) -> list[Charge]:
    """Rating itself, from loaded inputs (no database reads beyond the
    cached price books). `used_from`, when given, gets the usage amount of
    each stretch by its start (what an SLO judged per stretch credits)."""
    books = price_books(
        tiers=inputs.tiers or ((None, tenant.tier),),
        currency=tenant.billing_currency,
        start=start,
        end=end,
    )
    unpriced: dict[str, int] = defaultdict(int)
    used_from = defaultdict(Decimal) if used_from is None else used_from  # amount by stretch
    usage = _charges_usage(inputs.usage, books=books, unpriced=unpriced, used_from=used_from)
    if warnings is not None:
        warnings.extend(
            f"usage of {name} has no price: {tokens:,} tokens not billed"
            for name, tokens in sorted(unpriced.items())
        )
    fees = _charges_reservations(inputs.reservations, start=start, end=end, books=books)
    fees += _charges_dedicated(inputs.dedicated_gpus, start=start, end=end, books=books)
    if inputs.plans:  # the plan changed inside the period: each its own stretch
        return (
            usage
            + fees
            + charges_plans(
                inputs.plans, used_from=used_from, fees=fees, books=books, start=start, end=end
            )
        )
    return usage + fees + charges_plan(inputs.subscription, usage=usage, fees=fees, books=books)


def rating_inputs(
    *, tenants: list[Tenant], start: datetime, end: datetime
) -> dict[int, TenantInputs]:
    """Every tenant's inputs for [start, end) in five queries, however many
    tenants: usage is summed in SQL per tenant, model and stretch of
    unchanging prices (never per hour in Python)."""
    out = {t.pk: TenantInputs() for t in tenants}
    ids = list(out)
    moved = tier_timelines(ids)
    for tenant_id, tiers in moved.items():
        out[tenant_id].tiers = tiers
    plans = subscriptions_during(tenant_ids=ids, start=start, end=end)
    for tenant_id, stretches in plans.items():
        out[tenant_id].plans = tuple(stretches)
    edges = sorted(
        set().union(
            *(
                price_books(tiers=tiers, currency=c, start=start, end=end).edges(start, end)
                for tiers, c in {
                    (moved.get(x.pk, ((None, x.tier),)), x.billing_currency) for x in tenants
                }
            ),
            # Usage is summed apart on each side of a plan change too.
            {since for stretches in plans.values() for since, _ in stretches},
        )
        or {start}
    )
    rows = usage_by_stretch(
        start=start, end=end, edges=edges, tenant_ids=ids if len(ids) < 100 else None
    )
    # Model names looked up here: joining them in SQL costs more than the sums.
    names = dict(ServedModel.objects.values_list("pk", "name"))
    for tenant_id, seg, model_id, prompt, cached, completion, seconds, n in rows:
        if tenant_id in out:
            out[tenant_id].usage.append(
                (edges[seg], model_id, names[model_id], prompt, cached, completion, seconds, n)
            )
    for r in Reservation.objects.filter(tenant_id__in=ids, start__lt=end, end__gt=start):
        out[r.tenant_id].reservations.append((r.start, r.end, r.gpu_count))
    # GPUs of its dedicated pools, a MIG instance or time slice as its part of one.
    dedicated = (
        ReplicaGpu.objects.filter(
            replica__pool__kind=PoolKind.DEDICATED, replica__pool__owner__in=ids
        )
        .values("replica__pool__owner")
        .annotate(units=Sum("units"))
    )
    for row in dedicated:
        out[row["replica__pool__owner"]].dedicated_gpus = Decimal(row["units"]) / GPU_UNITS
    for tenant_id, subscription in subscriptions_at(tenant_ids=ids, moment=start).items():
        out[tenant_id].subscription = subscription
    return out


class Books:
    """The price book in force in each hour for the tier a tenant was in
    then (`tiers`: ((since, tier), ...), the first since None), and its
    prices in the tenant's billing `currency` (converted, where the book is
    in another, at the average rate of [start, end) up to now)."""

    def __init__(
        self,
        books: list[PriceBook],
        prices: dict[tuple[int, int], ModelPrice],
        *,
        tiers: tuple,
        currency: str,
        start: datetime,
        end: datetime,
    ):
        self.books = books
        self.tiers = tiers
        self.prices = prices
        self.currency = currency
        self.start, self.end = start, end
        self._cards: dict[tuple[int, int], RateCard] = {}
        self._rates: dict[str, FxConversion] = {}

    def rate(self, currency: str) -> FxConversion | None:
        """What one unit of `currency` is in the tenant's over the period
        (None: the same currency). The period's days up to now: a rate is
        published for days that have happened."""
        if currency == self.currency:
            return None
        if currency not in self._rates:
            end = max(min(self.end, timezone.now()), self.start + timedelta(hours=1))
            self._rates[currency] = fx_period_rate(
                base=currency, quote=self.currency, start=self.start, end=end
            )
        return self._rates[currency]

    def convert(self, amount: Decimal, currency: str) -> Decimal:
        """An amount (a price, a fee, a commitment) in `currency`, in the tenant's."""
        rate = self.rate(currency)
        return amount if rate is None else amount * rate.rate

    def note(self, book: PriceBook) -> str:
        """What a line priced from `book` says of its currency: nothing when
        it is the tenant's, else the rate it was converted at."""
        rate = self.rate(book.currency)
        if rate is None:
            return ""
        return f" ({book.currency} prices at {rate.rate.normalize():f} {rate.base}/{rate.quote})"

    def moved(self) -> bool:
        """Whether the tenant changed tiers inside [start, end)."""
        return any(self.start < since < self.end for since, _ in self.tiers[1:])

    def tier_note(self, book: PriceBook) -> str:
        """What a line says of the tier it was served in: only for a tenant
        that moved in the period, and a tier's own book (an all-tiers book
        priced both sides alike)."""
        return f", {book.tier} tier" if book.tier and self.moved() else ""

    def tier_at(self, moment: datetime) -> str:
        """The tier the tenant was in at `moment`."""
        return tier_at(self.tiers, moment)

    def at(self, moment: datetime) -> PriceBook | None:
        tier = self.tier_at(moment)
        live = [
            b
            for b in self.books
            if b.tier in ("", tier)
            and b.effective_from <= moment
            and (b.effective_to is None or moment < b.effective_to)
        ]
        # A tier's own book over an all-tiers one; then one in the tenant's
        # currency over one to convert; then the one in force since the
        # latest moment (a new list replaces the one before it, even when
        # that one was left open); then the newest version.
        live.sort(
            key=lambda b: (b.tier != "", b.currency == self.currency, b.effective_from, b.version),
            reverse=True,
        )
        return live[0] if live else None

    def price(self, book: PriceBook, model_id: int) -> ModelPrice | None:
        return self.prices.get((book.pk, model_id))

    def card(self, book: PriceBook, model_id: int) -> RateCard | None:
        price = self.price(book, model_id)
        if price is None:
            return None
        key = (book.pk, model_id)
        if key not in self._cards:
            card = RateCard.of(price)
            rate = self.rate(book.currency)
            self._cards[key] = card if rate is None else card.scaled(rate.rate)
        return self._cards[key]

    def priced_models(self, book: PriceBook | None) -> set[int]:
        return {model_id for book_id, model_id in self.prices if book and book_id == book.pk}

    def book(self, book_id: int) -> PriceBook:
        return next(b for b in self.books if b.pk == book_id)

    def label(self, book_id: int) -> str:
        book = self.book(book_id)
        return f"{book.name} v{book.version}"

    def edges(self, start: datetime, end: datetime) -> set[datetime]:
        """The starts of the stretches of [start, end) over which neither
        the book in force (it changes only where a book begins or ends) nor
        the calendar month nor the tenant's tier changes."""
        edges = {start}
        for b in self.books:
            edges.update(t for t in (b.effective_from, b.effective_to) if t and start < t < end)
        edges.update(since for since, _ in self.tiers[1:] if start < since < end)
        month = month_start(start)
        while (month := months_add(month, 1)) < end:
            edges.add(month)
        return edges


_books_cache: ContextVar[dict | None] = ContextVar("rating_books_cache", default=None)


@contextmanager
def rating_session():
    """Within it, price books are read once per (tier, period), not once per
    tenant (an invoice run rates every tenant of a period)."""
    token = _books_cache.set({})
    try:
        yield
    finally:
        _books_cache.reset(token)


def price_books(
    *,
    tier: str | None = None,
    tiers: tuple | None = None,
    currency: str,
    start: datetime,
    end: datetime,
) -> Books:
    """The books that may price usage in [start, end) of a tenant billed
    in `currency`, in one `tier` throughout or moving through `tiers`
    (((since, tier), ...), the first since None)."""
    tiers = tiers or ((None, tier),)
    cache = _books_cache.get()
    if cache is None:
        return _books_load(tiers=tiers, currency=currency, start=start, end=end)
    key = (tiers, currency, start, end)
    if key not in cache:
        cache[key] = _books_load(tiers=tiers, currency=currency, start=start, end=end)
    return cache[key]


def _books_load(*, tiers: tuple, currency: str, start: datetime, end: datetime) -> Books:
    names = {tier for _, tier in tiers}
    books = list(
        PriceBook.objects.filter(Q(tier__in=names) | Q(tier=""), effective_from__lt=end)
        .filter(Q(effective_to__isnull=True) | Q(effective_to__gt=start))
        .order_by("effective_from")
    )
    prices = {
        (p.book_id, p.served_model_id): p
        for p in ModelPrice.objects.filter(book__in=books)
        .select_related("served_model")
        .prefetch_related("tiers")
    }
    return Books(books, prices, tiers=tiers, currency=currency, start=start, end=end)


def _charges_usage(
    usage: list[tuple],
    *,
    books: Books,
    unpriced: dict[str, int],
    used_from: dict[datetime, Decimal] | None = None,
) -> list[Charge]:
    """The usage lines; `used_from` gets each stretch's amount (by the
    stretch's start: what a plan in force then discounts)."""
    volume: dict[tuple[int, str], int] = defaultdict(int)  # the period's tokens so far
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    tiers: dict[tuple, dict[int, str]] = defaultdict(dict)  # a line's graduated tiers
    for since, model_id, name, prompt, cached, completion, seconds, _ in usage:
        book = books.at(since)
        card = books.card(book, model_id) if book else None
        if card is None:
            unpriced[name] += prompt + completion
            continue
        for kind, tokens in usage_counts(
            prompt=prompt, cached=cached, completion=completion
        ).items():
            done = volume[(model_id, kind)]
            steps = card.steps[kind]
            starts = [start for start, _ in steps]
            position = done
            for quantity, per_mtok in card_pieces(card, kind, done, tokens):
                key = ("tokens", name, kind, book.pk, per_mtok)
                line = lines[key]
                line[0] += quantity
                line[1] += quantity * per_mtok / MILLION
                if used_from is not None:
                    used_from[since] = used_from.get(since, 0) + quantity * per_mtok / MILLION
                index = bisect_right(starts, position) - 1
                tiers[key][index] = tier_label(steps, index)
                position += int(quantity)
            volume[(model_id, kind)] = done + tokens
        if card.per_gpu_second is not None and seconds:
            line = lines[("gpu_seconds", name, None, book.pk, card.per_gpu_second)]
            line[0] += seconds
            line[1] += seconds * card.per_gpu_second
            if used_from is not None:
                used_from[since] = used_from.get(since, 0) + seconds * card.per_gpu_second
    charges = []
    for key, (quantity, amount) in lines.items():
        if not quantity:
            continue
        kind, model, token_kind, book_id, unit = key
        charges.append(
            Charge(
                kind=kind,
                description=_usage_description(model, token_kind, tiers.get(key, {}))
                + books.tier_note(books.book(book_id))
                + books.note(books.book(book_id)),
                quantity=quantity,
                unit_price=unit,
                amount=amount,
                model=model,
                token_kind=token_kind,
                book=books.label(book_id),
            )
        )
    return charges


def _usage_description(model: str, token_kind: str | None, tiers: dict[int, str]) -> str:
    """Which model, kind and, for graduated prices, which volume tier(s):
    "tiny-llama: output tokens, tier 2 (above 10M)" (two tiers of one
    price are one line)."""
    if not token_kind:
        return f"{model}: GPU-seconds"
    named = " and ".join(label for _, label in sorted(tiers.items()) if label)
    return f"{model}: {token_kind.replace('_', ' ')} tokens" + (f", {named}" if named else "")


def _charges_reservations(reservations, *, start, end, books: Books) -> list[Charge]:
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for r_start, r_end, gpu_count in reservations:
        for since, hours in _stretches(max(start, r_start), min(end, r_end), books):
            book = books.at(since)
            if book is None or not book.reservation_per_gpu_hour:
                continue
            gpu_hours = hours * gpu_count
            unit = books.convert(book.reservation_per_gpu_hour, book.currency)
            line = lines[(book.pk, unit)]
            line[0] += gpu_hours
            line[1] += gpu_hours * unit
    return _fee_charges("reservation", "Reserved GPUs", lines, books)


def _fee_charges(kind: str, description: str, lines: dict, books: Books) -> list[Charge]:
    """A fee's lines, one per (book, unit price): (quantity, amount) each."""
    return [
        Charge(
            kind,
            description + books.note(books.book(book_id)),
            q,
            unit,
            amount,
            book=books.label(book_id),
        )
        for (book_id, unit), (q, amount) in lines.items()
    ]


def _charges_dedicated(gpus: Decimal, *, start, end, books: Books) -> list[Charge]:
    if not gpus:
        return []
    # Hours summed per (book, month) first, divided once: exact for whole months.
    hours: dict[tuple, Decimal] = defaultdict(Decimal)
    for since, used in _stretches(start, end, books):
        book = books.at(since)
        if book is not None and book.dedicated_per_gpu_month:
            unit = books.convert(book.dedicated_per_gpu_month, book.currency)
            hours[(book.pk, unit, month_hours(since))] += used
    lines: dict[tuple, list[Decimal]] = defaultdict(lambda: [Decimal(0), Decimal(0)])
    for (book_id, unit, hours_in_month), used in hours.items():
        line = lines[(book_id, unit)]
        line[0] += used * gpus / hours_in_month
        line[1] += used * gpus * unit / hours_in_month
    return _fee_charges("dedicated", "Dedicated GPUs (GPU-months)", lines, books)


def _stretches(start: datetime, end: datetime, books: Books):
    """(stretch start, hours) over [start, end), cut wherever the book in
    force or the month changes."""
    if start >= end:
        return
    edges = [*sorted(e for e in books.edges(start, end) if start <= e < end), end]
    for since, until in pairwise(edges):
        yield since, Decimal((until - since).total_seconds()) / 3600
