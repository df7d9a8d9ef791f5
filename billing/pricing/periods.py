"""Billing periods: monthly, from a subscription's anchor day (1-28) at
00:00 UTC, half-open [start, end) (the calendar maths is core.calendar's).
A tenant with no subscription is billed by calendar month."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Q

from billing.models import Subscription
from core.calendar import period_containing, period_last_closed
from tenants.models import Tenant


def subscriptions_at(*, tenant_ids, moment: datetime) -> dict[int, Subscription]:
    """Each tenant's subscription in force at `moment` (the latest started
    wins), in one query for however many tenants."""
    out: dict[int, Subscription] = {}
    subscriptions = (
        Subscription.objects.filter(tenant_id__in=list(tenant_ids), start__lte=moment)
        .filter(Q(end__isnull=True) | Q(end__gt=moment))
        .select_related("plan", "issuer")
        .order_by("tenant_id", "start")
    )
    for subscription in subscriptions:
        out[subscription.tenant_id] = subscription
    return out


def subscriptions_during(
    *, tenant_ids, start: datetime, end: datetime
) -> dict[int, list[tuple[datetime, Subscription]]]:
    """Each tenant's subscriptions in force in [start, end), as (from, the
    subscription) in order, the first from `start` (a plan moved mid-period
    is a second stretch); only tenants whose plan changed inside the
    period (more than one, or a first one from after `start`), in one query."""
    found: dict[int, list[tuple[datetime, Subscription]]] = {}
    subscriptions = (
        Subscription.objects.filter(tenant_id__in=list(tenant_ids), start__lt=end)
        .filter(Q(end__isnull=True) | Q(end__gt=start))
        .select_related("plan")
        .order_by("tenant_id", "start")
    )
    for subscription in subscriptions:
        stretches = found.setdefault(subscription.tenant_id, [])
        since = max(start, subscription.start)
        if stretches and stretches[-1][0] == since:  # the latest started wins
            stretches.pop()
        stretches.append((since, subscription))
    return {t: s for t, s in found.items() if len(s) > 1 or s[0][0] > start}


def tenants_by_period(
    *, tenants: list[Tenant], moment: datetime, closed: bool
) -> dict[tuple[datetime, datetime], list[Tenant]]:
    """Tenants grouped by their billing period (from their anchor day): the
    one running at `moment`, or with `closed` the last one ended by it."""
    subscriptions = subscriptions_at(tenant_ids=[t.pk for t in tenants], moment=moment)
    groups: dict[tuple[datetime, datetime], list[Tenant]] = {}
    for tenant in tenants:
        anchor = subscriptions[tenant.pk].anchor_day if tenant.pk in subscriptions else 1
        if closed:
            period = period_last_closed(anchor_day=anchor, as_of=moment)
        else:
            period = period_containing(anchor_day=anchor, moment=moment)
        groups.setdefault(period, []).append(tenant)
    return groups


def tenant_period(*, tenant: Tenant, moment: datetime) -> tuple[datetime, datetime]:
    """The tenant's billing period running at `moment`."""
    (period,) = tenants_by_period(tenants=[tenant], moment=moment, closed=False)
    return period
