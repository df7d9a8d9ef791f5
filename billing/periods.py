"""Billing periods: monthly, from a subscription's anchor day (1-28) at
00:00 UTC, half-open [start, end). A tenant with no subscription is billed
by calendar month."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import Q

from billing.models import Subscription
from tenants.models import Tenant

_DAY = timedelta(days=1)


def _month_shift(year: int, month: int, by: int) -> tuple[int, int]:
    index = year * 12 + (month - 1) + by
    return index // 12, index % 12 + 1


def period_containing(*, anchor_day: int, moment: datetime) -> tuple[datetime, datetime]:
    moment = moment.astimezone(UTC)
    year, month = moment.year, moment.month
    if moment.day < anchor_day:
        year, month = _month_shift(year, month, -1)
    start = datetime(year, month, anchor_day, tzinfo=UTC)
    next_year, next_month = _month_shift(year, month, 1)
    return start, datetime(next_year, next_month, anchor_day, tzinfo=UTC)


def period_last_closed(*, anchor_day: int, as_of: datetime) -> tuple[datetime, datetime]:
    """The latest period that ended at or before `as_of`."""
    current_start, _ = period_containing(anchor_day=anchor_day, moment=as_of)
    return period_previous(anchor_day=anchor_day, start=current_start)


def period_previous(*, anchor_day: int, start: datetime) -> tuple[datetime, datetime]:
    return period_containing(anchor_day=anchor_day, moment=start - _DAY)


def subscription_at(*, tenant: Tenant, moment: datetime) -> Subscription | None:
    return (
        Subscription.objects.filter(tenant=tenant, start__lte=moment)
        .filter(Q(end__isnull=True) | Q(end__gt=moment))
        .select_related("plan", "issuer")
        .order_by("-start")
        .first()
    )


def anchor_day_of(*, tenant: Tenant, moment: datetime) -> int:
    subscription = subscription_at(tenant=tenant, moment=moment)
    return subscription.anchor_day if subscription else 1
