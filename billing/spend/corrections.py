"""The ledger corrects the gateway's fast spend accounts, and tells a
prepaid tenant its credit is running low (billing.spend.notices.credit_low_check)
from the same figures.

The gateway counts what each request's tokens cost as it settles; the
ledger knows more (GPU-seconds attributed after the fact, the plan's
discount rounded as invoices round it, usage that reached it some other
way, requests a killed gateway never settled). Every few minutes
`spend_corrections_write` re-derives, for each account a tenant is held to,
its spend of the usage received before a cut, and writes it as a
SpendCorrection; the gateways apply it (billing.spend.accounts: it replaces
their count of that usage, once) and record the drift they found.

The cut is the last hour boundary at least `MARGIN` old, and no later than
the first hour the metering pipeline has yet to roll up, so the ledger is
complete up to it. Each correction re-derives the whole account up to its
cut, so usage that reached the ledger late (a late record, a window
attributed after its grace) is counted by the next one."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.models import Plan, SpendCorrection
from billing.spend.notices import credit_low_check
from billing.spend.terms import PREPAID, account_spend, spend_terms
from core.changes import correction_written
from metering.rollups import hour_floor
from metering.selectors.usage import rollups_complete_before
from tenants.models import Tenant

MARGIN = timedelta(minutes=2)  # past the recorder's flush and a metering run


@dataclass(frozen=True)
class Drift:
    tenant_slug: str
    kind: str
    account: str
    cut: datetime
    ledger: Decimal
    drift: Decimal | None  # None: no gateway held the account to apply it
    applied_at: datetime | None


def spend_cut(*, now: datetime) -> datetime:
    cut = hour_floor(now - MARGIN)
    dirty = rollups_complete_before()
    return cut if dirty is None else min(cut, dirty)


def held_tenants(*, now: datetime):
    """Tenants with a budget or on a prepaid plan now."""
    prepaid_plans = Plan.objects.filter(prepaid=True)
    prepaid = Q(
        subscriptions__plan__in=prepaid_plans,
        subscriptions__start__lte=now,
    ) & (Q(subscriptions__end__isnull=True) | Q(subscriptions__end__gt=now))
    return (
        Tenant.objects.filter(Q(policy__monthly_budget__isnull=False) | prepaid)
        .select_related("policy")
        .distinct()
        .order_by("pk")
    )


def spend_corrections_write(*, now: datetime | None = None, progress=None) -> list[SpendCorrection]:
    """A correction for each account held now whose cut has moved on since
    its last; each told to the gateways as its transaction commits."""
    now = now or timezone.now()
    cut = spend_cut(now=now)
    written = []
    unbilled: dict[int, Decimal] = {}  # prepaid tenants' usage no invoice has drawn
    tenants = list(held_tenants(now=now))
    for n, tenant in enumerate(tenants, start=1):
        terms = spend_terms(tenant=tenant, now=now)
        for account in terms.accounts if terms else ():
            if cut <= account.since:
                continue  # nothing of this account's usage is closed yet
            ledger = account_spend(tenant=tenant, since=account.since, cut=cut)
            if account.kind == PREPAID:
                unbilled[tenant.pk] = ledger
            with transaction.atomic():
                row, created = SpendCorrection.objects.get_or_create(
                    account=account.key,
                    cut=cut,
                    defaults={"tenant": tenant, "kind": account.kind, "ledger": ledger},
                )
                if created:
                    correction_written(row.pk)
                    written.append(row)
        if progress is not None:
            progress(n, len(tenants))
    with transaction.atomic():
        credit_low_check(tenant_ids=list(unbilled), unbilled=unbilled, now=now)
    return written


def spend_corrections_pending(
    *, correction_id: int | None = None, since: timedelta = timedelta(days=2)
) -> list[SpendCorrection]:
    """The correction `correction_id`, or every one not applied yet and
    written within `since` (for a gateway that was not listening)."""
    rows = SpendCorrection.objects.filter(applied_at__isnull=True)
    if correction_id is not None:
        rows = rows.filter(pk=correction_id)
    else:
        rows = rows.filter(created_at__gte=timezone.now() - since)
    return list(rows.order_by("cut", "pk"))


def spend_correction_applied(*, correction_id: int, drift: Decimal) -> bool:
    """Record the drift the first gateway to apply the correction found."""
    return bool(
        SpendCorrection.objects.filter(pk=correction_id, applied_at__isnull=True).update(
            applied_at=timezone.now(), drift=drift
        )
    )


def spend_drift_latest(*, applied: bool = False) -> list[Drift]:
    """Each tenant's latest correction per kind of account (`applied`: the
    latest applied one), the largest drift first: for reconciliation and
    metrics."""
    rows = SpendCorrection.objects.all()
    if applied:
        rows = rows.filter(applied_at__isnull=False)
    # One per tenant and kind: an account's key names its start, so each
    # period (or invoice, for prepaid) starts a new one; the latest is held now.
    rows = (
        rows.select_related("tenant")
        .order_by("tenant_id", "kind", "-cut")
        .distinct("tenant_id", "kind")
    )
    return sorted(
        (
            Drift(
                tenant_slug=r.tenant.slug,
                kind=r.kind,
                account=r.account,
                cut=r.cut,
                ledger=r.ledger,
                drift=r.drift,
                applied_at=r.applied_at,
            )
            for r in rows
        ),
        key=lambda d: (-abs(d.drift or 0), d.tenant_slug, d.kind),
    )


class SpendDriftCollector:
    """/metrics: each held account's drift at its latest applied correction."""

    def collect(self):
        from prometheus_client.core import GaugeMetricFamily

        gauge = GaugeMetricFamily(
            "billing_spend_counter_drift",
            "The gateway's spend counter less the ledger's spend, at the account's latest "
            "correction, in the tenant's currency (positive: the gateway had counted more).",
            labels=["tenant", "account"],
        )
        for drift in spend_drift_latest(applied=True):
            gauge.add_metric([drift.tenant_slug, drift.kind], float(drift.drift))  # ok-float
        yield gauge
