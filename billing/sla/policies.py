"""Which SLO policy applies to a tenant: its plan's when the plan has
one, else its tier's (the default); none, and nothing is promised."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import Min

from billing.models import SloPolicy, Subscription
from billing.pricing.periods import subscriptions_at
from tenants.models import Tenant


class SloPolicies:
    """Every policy with its credit schedule, read once (a small table)."""

    def __init__(self, policies: list[SloPolicy]):
        self.by_plan = {p.plan_id: p for p in policies if p.plan_id is not None}
        self.by_tier = {p.tier: p for p in policies if p.plan_id is None}

    def __bool__(self) -> bool:
        return bool(self.by_plan or self.by_tier)

    def for_tenant(self, tenant: Tenant, subscription: Subscription | None) -> SloPolicy | None:
        return self.for_tier(tenant.tier, subscription)

    def for_tier(self, tier: str, subscription: Subscription | None) -> SloPolicy | None:
        """The plan's policy when it has one, else the tier's."""
        if subscription is not None and subscription.plan_id in self.by_plan:
            return self.by_plan[subscription.plan_id]
        return self.by_tier.get(tier)


def slo_policies_load() -> SloPolicies:
    return SloPolicies(list(SloPolicy.objects.prefetch_related("credit_rules")))


def slo_policies_at(*, tenants: list[Tenant], moment: datetime) -> dict[int, SloPolicy | None]:
    """Each tenant's policy under the subscription in force at `moment`."""
    policies = slo_policies_load()
    if not policies:
        return {t.pk: None for t in tenants}
    subscriptions = subscriptions_at(tenant_ids=[t.pk for t in tenants], moment=moment)
    return {t.pk: policies.for_tenant(t, subscriptions.get(t.pk)) for t in tenants}


def itl_promises(*, owners: list[Tenant], moment: datetime) -> tuple[Decimal | None, dict]:
    """The inter-token p95 promised (ms; None: nothing promised): the
    tightest any policy makes (what a shared pool's replicas must keep, any
    tenant may run there), and each owner's own (tenant id -> ms, what its
    reserved or dedicated pool's replicas must keep)."""
    tightest = SloPolicy.objects.aggregate(ms=Min("itl_p95_ms"))["ms"]
    if tightest is None or not owners:
        return tightest, {t.pk: None for t in owners}
    own = slo_policies_at(tenants=owners, moment=moment)
    return tightest, {k: p and p.itl_p95_ms for k, p in own.items()}
