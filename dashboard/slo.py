"""SLO compliance pages. Finance's /finance/slo/: over the last 7, 30 or
90 days, each tier's figures against its default policy and each
tenant's against its own, breaches marked, and a chart of daily
compliance (the share of tenants with a policy that met every target,
per tier). A tenant's own figures on its usage page (slo_tenant_context,
dashboard.portal): this billing period so far and day by day. Finance
waives or adjusts a draft invoice's SLA credit from the invoice page
(dashboard.invoices)."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta

from django.shortcuts import render
from django.utils import timezone

from billing.pricing.periods import tenant_period
from billing.sla.selectors import TenantSlo, TierSlo, slo_by_tier, slo_compliance, slo_days
from dashboard.forms import PeriodFilterForm
from metering.selectors.usage import usage_synthetic_span
from tenants.access import finance_staff_required

DAYS = {"7": 7, "30": 30, "90": 90}


def slo_range(*, days: int, now: datetime) -> tuple[datetime, datetime]:
    """The last `days` whole UTC days and today up to the current hour's end."""
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = (end - timedelta(days=days)).replace(hour=0)
    return start, end


@finance_staff_required
def finance_slo(request):
    days = PeriodFilterForm(request.GET, periods=DAYS, default=30).days_value()
    start, end = slo_range(days=days, now=timezone.now())
    tenants = slo_compliance(tenant=None, start=start, end=end)
    tiers = slo_by_tier(start=start, end=end, tenants=tenants)
    context = {
        "days": days,
        "periods": DAYS,
        "start": start,
        "end": end,
        "tiers": tiers,
        "tenants": sorted(tenants, key=lambda t: (not _breached(t), t.tenant.slug)),
        "breached": sum(1 for t in tenants if _breached(t)),
        "chart": slo_tier_chart(tiers, tenants, start=start, end=end),
        "synthetic": usage_synthetic_span(start=start, end=end),
    }
    return render(request, "dashboard/slo.html", context)


def _breached(row: TenantSlo) -> bool:
    return row.period is not None and row.period.breached


def slo_tier_chart(
    tiers: list[TierSlo], tenants: list[TenantSlo], *, start: datetime, end: datetime
) -> dict:
    """Per tier and UTC day, the percent of tenants with a policy and
    requests that day that met every target (None: no such tenant)."""
    labels = [day.isoformat() for day in slo_days(start, end)]
    index = {label: n for n, label in enumerate(labels)}
    counts: dict[str, list[list[int]]] = defaultdict(lambda: [[0, 0] for _ in labels])
    for row in tenants:
        if row.policy is None:
            continue
        for day in row.days:
            cell = counts[row.tenant.tier][index[day.day.isoformat()]]
            cell[0] += not day.breached
            cell[1] += 1
    datasets = [
        {
            "label": tier.tier,
            "data": [  # ok-float: chart points
                round(100 * met / seen, 1) if seen else None for met, seen in counts[tier.tier]
            ],
            "spanGaps": True,
        }
        for tier in tiers
    ]
    return {"labels": labels, "datasets": datasets}


def slo_tenant_context(*, tenant, start: datetime, end: datetime, now: datetime) -> dict:
    """What a tenant's usage page shows of its SLOs: its policy, this
    billing period so far, and [start, end) day by day (a chart and a
    table, newest first)."""
    period_start, period_end = tenant_period(tenant=tenant, moment=now)
    (period,) = slo_compliance(tenant=tenant, start=period_start, end=now)
    (recent,) = slo_compliance(tenant=tenant, start=start, end=end)
    labels = [day.isoformat() for day in slo_days(start, end)]
    by_day = {row.day.isoformat(): row for row in recent.days}

    def series(pick) -> list:
        points = []
        for label in labels:
            value = pick(by_day[label]) if label in by_day else None
            points.append(None if value is None else float(value))  # ok-float: a chart point
        return points

    return {
        "synthetic": usage_synthetic_span(start=start, end=end, tenant=tenant),
        "policy": period.policy,
        "period_start": period_start,
        "period_end": period_end,
        "period": period.period,
        "days": list(reversed(recent.days)),
        "breach_days": recent.breach_days,
        "chart": {
            "labels": labels,
            "datasets": [
                {"label": "Availability, %", "data": series(lambda r: r.availability),
                 "yAxisID": "y", "spanGaps": True},
                {"label": "TTFT p95, ms", "data": series(lambda r: r.ttft_p95_ms),
                 "yAxisID": "y1", "spanGaps": True},
                {"label": "Inter-token p95, ms", "data": series(lambda r: r.itl_p95_ms),
                 "yAxisID": "y1", "spanGaps": True},
            ],
        },
    }  # fmt: skip
