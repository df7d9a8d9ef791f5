"""What spend control tells a tenant (webhooks.event_emit): its prepaid
credit running low, once per newest grant."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from billing.models import CreditGrant
from billing.money import money_format, to_minor
from billing.spend.wallet import grant_in_force, wallet_balances_many
from webhooks.choices import EventType
from webhooks.services import event_emit


def credit_low_check(
    *,
    tenant_ids: Iterable[int],
    unbilled: Mapping[int, Decimal] | None = None,
    now: datetime | None = None,
) -> list[int]:
    """credit.low for each tenant whose prepaid credit left, in one
    currency, is at or under WEBHOOKS_CREDIT_LOW_PERCENT of its grants in
    force at `now` (granted, not expired: what the gateway holds it to),
    once per newest grant: a new grant arms it again. Left is what those
    grants hold less `unbilled`: a tenant's usage no invoice has drawn yet,
    in its billing currency (the spend corrections' ledger figure), so
    credit running low mid-month is told before the gateway refuses. The
    tenants told."""
    percent = settings.WEBHOOKS["CREDIT_LOW_PERCENT"]
    now = now or timezone.now()
    tenant_ids = sorted(set(tenant_ids))
    grants: dict[tuple[int, str], list] = {}
    for grant in CreditGrant.objects.filter(tenant_id__in=tenant_ids).select_related("tenant"):
        if grant_in_force(grant, now):
            grants.setdefault((grant.tenant_id, grant.currency), []).append(grant)
    left = wallet_balances_many(tenant_ids=tenant_ids)
    told = []
    for (tenant_id, currency), held in sorted(grants.items()):
        granted = sum(to_minor(g.amount, g.currency) for g in held)
        newest = max(held, key=lambda g: g.pk)
        tenant = newest.tenant
        in_force = {g.pk for g in held}
        remaining = sum(
            b.remaining_minor for b in left.get(tenant_id, []) if b.grant.pk in in_force
        )
        if unbilled and currency == tenant.billing_currency:
            remaining = max(0, remaining - to_minor(unbilled.get(tenant_id, 0), currency))
        if granted <= 0 or remaining * 100 > granted * percent:
            continue
        emitted = event_emit(
            type=EventType.CREDIT_LOW,
            tenant=tenant,
            key=f"credit.low:{tenant_id}:{currency}:{newest.pk}",
            summary=(
                f"{tenant.name}: prepaid credit low, {money_format(remaining, currency)} left "
                f"of {money_format(granted, currency)}"
            ),
            data={
                "currency": currency,
                "remaining_minor": remaining,
                "granted_minor": granted,
                "percent_left": round(remaining * 100 / granted, 2),
                "threshold_percent": percent,
            },
        )
        if emitted is not None:
            told.append(tenant_id)
    return told
