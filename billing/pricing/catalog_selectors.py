"""Reads of price books, plans and subscriptions for finance (pages, API):
each version with its status, a version's prices as the start of the next
one, plans with whether their terms may still change, a tenant's
subscriptions. Platform finance staff code paths only."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Min, Prefetch, Q, QuerySet
from django.utils import timezone

from billing.models import ModelPrice, Plan, PriceBook, Subscription
from billing.pricing.catalog import FEES, TOKEN_PRICES
from serving.models import ServedModel
from tenants.models import Tenant

SCHEDULED, IN_FORCE, SUPERSEDED, ENDED = "scheduled", "in_force", "superseded", "ended"
BOOK_STATUSES = (SCHEDULED, IN_FORCE, SUPERSEDED, ENDED)


def price_book_status(book: PriceBook, *, now: datetime | None = None) -> str:
    """scheduled (not yet in force: editable), in_force, superseded (a
    later version took over) or ended (its end passed with no successor)."""
    now = now or timezone.now()
    if book.effective_from > now:
        return SCHEDULED
    if book.effective_to is None or book.effective_to > now:
        return IN_FORCE
    successor = getattr(book, "successor_from", None)
    return SUPERSEDED if successor is not None and successor <= book.effective_to else ENDED


def price_book_list(*, name: str | None = None, now: datetime | None = None) -> list[PriceBook]:
    """Every version (newest first per name), each with `status` and
    `price_count` set."""
    books = PriceBook.objects.annotate(price_count=Count("prices")).order_by("name", "-version")
    if name:
        books = books.filter(name=name)
    books = list(books)
    starts: dict[str, list[tuple[int, datetime]]] = {}
    for book in books:
        starts.setdefault(book.name, []).append((book.version, book.effective_from))
    for book in books:
        later = [s for v, s in starts[book.name] if v > book.version]
        book.successor_from = min(later) if later else None
        book.status = price_book_status(book, now=now)
    return books


def price_book_get(*, book_id: int, now: datetime | None = None) -> PriceBook:
    """One version with its prices and their volume tiers (DoesNotExist if none)."""
    book = PriceBook.objects.prefetch_related(_prices()).get(pk=book_id)
    book.successor_from = (
        PriceBook.objects.filter(name=book.name, version__gt=book.version)
        .aggregate(start=Min("effective_from"))
        .get("start")
    )
    book.status = price_book_status(book, now=now)
    return book


def price_book_versions(*, name: str) -> QuerySet[PriceBook]:
    return PriceBook.objects.filter(name=name).order_by("-version")


def _prices() -> Prefetch:
    return Prefetch(
        "prices",
        queryset=ModelPrice.objects.select_related("served_model")
        .prefetch_related("tiers")
        .order_by("served_model__name"),
    )


def price_book_as_next(book: PriceBook) -> dict:
    """A version's values as a new version of it starts from (its prices
    and tiers copied), in the shape price_book_version_create takes."""
    return {
        "name": book.name,
        "tier": book.tier,
        "currency": book.currency,
        **{f: getattr(book, f) for f in FEES},
        "prices": [
            {
                "served_model": price.served_model,
                **{f: getattr(price, f) for f in TOKEN_PRICES},
                "per_gpu_second": price.per_gpu_second,
                "tiers": [
                    {"kind": t.kind, "from_tokens": t.from_tokens, "per_mtok": t.per_mtok}
                    for t in price.tiers.all()
                ],
            }
            for price in book.prices.all()
        ],
    }


def served_model_list() -> QuerySet[ServedModel]:
    """The models a version may price."""
    return ServedModel.objects.order_by("name")


def served_model_by_name(*, name: str) -> ServedModel | None:
    return ServedModel.objects.filter(name=name).first()


def plan_list(*, now: datetime | None = None) -> QuerySet[Plan]:
    """Every plan with `subscribed` (subscriptions in force or scheduled)
    and `started` (subscriptions already started: its terms are fixed)."""
    now = now or timezone.now()
    return Plan.objects.annotate(
        subscribed=Count(
            "subscriptions",
            filter=Q(subscriptions__end__isnull=True) | Q(subscriptions__end__gt=now),
        ),
        started=Count("subscriptions", filter=Q(subscriptions__start__lte=now)),
    ).order_by("name")


def plan_get(*, plan_id: int) -> Plan:
    return Plan.objects.get(pk=plan_id)


def subscription_list(*, tenant: Tenant) -> QuerySet[Subscription]:
    """A tenant's subscriptions, latest first."""
    return Subscription.objects.filter(tenant=tenant).select_related("plan").order_by("-start")


def subscription_get(*, tenant: Tenant, subscription_id: int) -> Subscription:
    return Subscription.objects.select_related("plan", "tenant").get(
        tenant=tenant, pk=subscription_id
    )


def subscription_list_all(*, now: datetime | None = None) -> QuerySet[Subscription]:
    """Every tenant's subscriptions in force or scheduled (finance's view)."""
    now = now or timezone.now()
    return (
        Subscription.objects.filter(Q(end__isnull=True) | Q(end__gt=now))
        .select_related("plan", "tenant")
        .order_by("tenant__name", "start")
    )
