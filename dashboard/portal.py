"""The tenant portal's usage page: usage over time by model (a chart),
tokens and device-seconds, its service levels against its plan's targets
(dashboard.slo), spend this billing period against the budget,
what is owed (open invoices per currency, each with how to pay it: the
Stripe hosted invoice page once synced), an estimate of this period's
invoice, recent invoices, its energy and emissions by model (its share of
the GPUs' draw, Scope 3 for it), and export downloads. Spend so far is shown
rounded line by line, as the invoice and its estimate round it, so the
two agree; the gateway's standing is exact, rounded once (the page says
so). Reads hourly rollups,
and the ledger for the SLO percentiles."""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render
from django.utils import timezone

from billing.invoicing.invoices import invoice_estimate
from billing.invoicing.lines import lines_total_minor
from billing.invoicing.selectors import days_overdue, invoice_list, invoices_open
from billing.pricing.periods import tenant_period
from billing.spend.balances import spend_standing
from billing.spend.budgets import spend_charges
from dashboard.forms import PeriodFilterForm
from dashboard.slo import slo_tenant_context
from metering.selectors.requests import requests_recent
from metering.selectors.usage import UsageQuery, energy_totals, usage_summary
from tenants.access import principal_for_session

DAYS = {"7": 7, "30": 30, "90": 90}


@login_required
def usage(request):
    principal = principal_for_session(request)
    if principal is None or principal.tenant is None:
        raise PermissionDenied  # finance staff pick a tenant on the finance pages
    context = usage_context(tenant=principal.tenant, days=usage_days(request))
    return render(request, "dashboard/usage.html", context)


def usage_days(request) -> int:
    """The usage page's period: `?days=` among DAYS, 30 by default."""
    return PeriodFilterForm(request.GET, periods=DAYS, default=30).days_value()


def usage_context(*, tenant, days: int) -> dict:
    """What the usage page shows of one tenant (its portal, or finance
    staff's drill-down into it) over the last `days`."""
    now = timezone.now()
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = (end - timedelta(days=days)).replace(hour=0)
    rows = list(usage_summary(tenant=tenant, query=UsageQuery(start=start, end=end)))
    chart = _chart(rows, start=start, days=days)
    totals = defaultdict(Decimal)
    for row in rows:
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "device_seconds"):
            totals[name] += row[name]
        totals["requests"] += sum(row[f"requests_{s}"] for s in ("ok", "aborted", "error"))
    period_start, period_end = tenant_period(tenant=tenant, moment=now)
    charges = spend_charges(tenant=tenant, start=period_start, end=now)
    spend = sum((c.amount for c in charges), Decimal(0))  # exact: what the budget counts
    policy = tenant.policy
    budget = policy.monthly_budget
    open_invoices = list(invoices_open(tenant=tenant))
    outstanding: dict[str, int] = defaultdict(int)
    for invoice in open_invoices:
        outstanding[invoice.currency] += invoice.due_minor
        invoice.days_overdue = days_overdue(due_at=invoice.due_at, as_of=now)
    return {
        "tenant": tenant,
        "days": days,
        "periods": DAYS,
        "start": start,
        "end": end,
        "chart": chart,
        "totals": dict(totals),
        "period_start": period_start,
        "period_end": period_end,
        "spend": spend,
        # Shown rounded line by line, as the invoice (and its estimate below) rounds it.
        "spend_minor": lines_total_minor(charges, currency=tenant.billing_currency),
        "budget": budget,
        "spend_pct": float(spend / budget * 100) if budget else None,  # ok-float: a bar width
        "soft_pct": policy.budget_soft_percent,
        "standing": spend_standing(tenant=tenant, now=now),
        "blocked": policy.budget_blocked_at is not None,
        "block_message": policy.budget_block_message,
        "invoices": list(invoice_list(tenant=tenant)[:5]),
        "open_invoices": open_invoices,
        "outstanding": dict(sorted(outstanding.items())),
        "estimate": invoice_estimate(tenant=tenant, now=now),
        "requests": requests_recent(tenant=tenant),
        "slo": slo_tenant_context(tenant=tenant, start=start, end=end, now=now),
        "energy": energy_rows(energy_totals(tenant=tenant, start=start, end=end)),
        "export_range": f"start={start:%Y-%m-%dT%H:%M:%SZ}&end={end:%Y-%m-%dT%H:%M:%SZ}",
    }


def energy_rows(rows: list[dict]) -> list[dict]:
    """Energy rows with kWh and gCO2e per million tokens (None without tokens)."""
    for row in rows:
        mtok = Decimal(row["tokens"]) / 1_000_000
        row["kwh_per_mtok"] = row["kwh"] / mtok if mtok else None
        row["g_per_mtok"] = row["co2e_g"] / mtok if mtok else None
    return rows


def _chart(rows: list[dict], *, start, days: int) -> dict:
    """Daily tokens per model, as Chart.js datasets."""
    labels = [(start + timedelta(days=n)).strftime("%Y-%m-%d") for n in range(days + 1)]
    index = {label: n for n, label in enumerate(labels)}
    series: dict[str, list[int]] = defaultdict(lambda: [0] * len(labels))
    for row in rows:
        day = row["period"].strftime("%Y-%m-%d")
        if day in index:
            name = row["model_name"] or "(no model)"
            series[name][index[day]] += row["prompt_tokens"] + row["completion_tokens"]
    return {
        "labels": labels,
        "datasets": [{"label": name, "data": data} for name, data in sorted(series.items())],
    }
