"""What the pages and the API read of SLO compliance. Every read takes
`tenant=` (invariant 5): a tenant reads its own figures only; None is
every tenant, for finance staff code paths only (with the figures per
tier beside them)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

from django.utils import timezone

from billing.models import SloPolicy
from billing.sla.compliance import Compliance, compliance_by_tenant, compliance_from_figures
from billing.sla.policies import slo_policies_at, slo_policies_load
from metering.selectors.slo import slo_figures
from tenants.models import Tenant

# The longest range one read may cover (the ledger is read request by request).
MAX_DAYS = 93


@dataclass
class TenantSlo:
    """One tenant's compliance over a range: as a whole and per UTC day
    (days with requests only), against its policy."""

    tenant: Tenant
    policy: SloPolicy | None
    period: Compliance | None
    days: list[Compliance] = field(default_factory=list)

    @property
    def breach_days(self) -> int:
        return sum(1 for day in self.days if day.breached)


@dataclass
class TierSlo:
    """A tier's figures over all its tenants' requests, against the tier's
    default policy, and how many of its tenants missed a target."""

    tier: str
    period: Compliance
    days: list[Compliance]
    tenants: int = 0
    breached: int = 0


def _policy_moment(start: datetime, end: datetime) -> datetime:
    """The plan that counts for a range: the one in force at its last
    instant so far."""
    return max(start, min(end, timezone.now()) - timedelta(microseconds=1))


def slo_compliance(*, tenant: Tenant | None, start: datetime, end: datetime) -> list[TenantSlo]:
    """Compliance over [start, end): of `tenant` (always one entry, with
    or without requests), or of every tenant that had requests (None)."""
    tenants = [tenant] if tenant is not None else list(Tenant.objects.order_by("slug"))
    policies = slo_policies_at(tenants=tenants, moment=_policy_moment(start, end))
    every = tenant is None
    whole = compliance_by_tenant(
        policies=policies, start=start, end=end, by_day=False, every_tenant=every
    )
    daily = compliance_by_tenant(
        policies=policies, start=start, end=end, by_day=True, every_tenant=every
    )
    return [
        TenantSlo(
            tenant=t,
            policy=policies[t.pk],
            period=whole[t.pk][0] if t.pk in whole else None,
            days=daily.get(t.pk, []),
        )
        for t in tenants
        if not every or t.pk in whole
    ]


def slo_by_tier(*, start: datetime, end: datetime, tenants: list[TenantSlo]) -> list[TierSlo]:
    """Every tier's figures over [start, end) (finance staff only), with
    the count of `tenants` (slo_compliance(tenant=None)) that missed."""
    defaults = slo_policies_load().by_tier
    whole = slo_figures(start=start, end=end, tenant_ids=None, by_day=False, group="tier")
    daily = slo_figures(start=start, end=end, tenant_ids=None, by_day=True, group="tier")
    days: dict[str, list[Compliance]] = defaultdict(list)
    for row in daily:
        days[row["key"]].append(compliance_from_figures(row, defaults.get(row["key"])))
    out = []
    for row in whole:
        mine = [t for t in tenants if t.tenant.tier == row["key"]]
        out.append(
            TierSlo(
                tier=row["key"],
                period=compliance_from_figures(row, defaults.get(row["key"])),
                days=days[row["key"]],
                tenants=len(mine),
                breached=sum(1 for t in mine if t.period is not None and t.period.breached),
            )
        )
    return out


def slo_days(start: datetime, end: datetime) -> list[date]:
    """The UTC days of [start, end)."""
    first, last = start.date(), (end - timedelta(microseconds=1)).date()
    return [first + timedelta(days=n) for n in range((last - first).days + 1)]
