"""Finance pages. The overview: revenue, cost and margin by tier this month
so far against last month (a chart), unabsorbed idle cost, and margin by
tenant and by model (sortable), each tenant a link to its drill-down (its
usage, spend, invoices, requests and margin). It reads the stored
month-to-date margin report (computed nightly, or on request), never rating
live, so it stays fast. Reconciliation: tokens vLLM served that metering
did not record (so nobody was billed for them), window by window."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import get_object_or_404, render
from django.utils import timezone

from billing.portal import usage_context
from billing.selectors import margin_report_latest
from metering.selectors import reconciliation_gaps
from tenants.access import principal_for_session
from tenants.models import Tenant


def _finance_only(request) -> None:
    principal = principal_for_session(request)
    if principal is None or not principal.is_finance:
        raise PermissionDenied


@login_required
def finance_overview(request):
    _finance_only(request)
    report = margin_report_latest()
    tables = report.tables if report else {}
    tiers = tables.get("tier", [])
    chart = {
        "labels": [row["tier"] for row in tiers],
        "datasets": [
            {"label": label, "data": [float(row[key]) for row in tiers]}  # ok-float: chart
            for label, key in (
                ("Revenue", "revenue"),
                ("Cost", "cost"),
                ("Margin", "margin"),
                ("Margin, last month", "prev_margin"),
            )
        ],
    }
    context = {
        "report": report,
        "tiers": tiers,
        "tenants": tables.get("tenant", []),
        "models": tables.get("model", []),
        "pools": tables.get("pool", []),
        "chart": chart,
    }
    return render(request, "billing/finance.html", context)


@login_required
def finance_tenant(request, slug: str):
    _finance_only(request)
    tenant = get_object_or_404(Tenant, slug=slug)
    context = usage_context(tenant=tenant, days=request.GET.get("days", "30"))
    report = margin_report_latest()
    rows = report.tables.get("tenant", []) if report else []
    context |= {
        "drill": True,
        "report": report,
        "margin": next((row for row in rows if row["tenant"] == slug), None),
        "tenant_param": f"&tenant={slug}",
    }
    return render(request, "billing/usage.html", context)


@login_required
def reconciliation(request):
    _finance_only(request)
    days = {"1": 1, "7": 7, "30": 30}.get(request.GET.get("days", "7"), 7)
    end = timezone.now()
    start = end - timedelta(days=days)
    gaps, totals = reconciliation_gaps(start=start, end=end)
    context = {"gaps": gaps, "totals": totals, "days": days, "start": start, "end": end}
    return render(request, "billing/reconciliation.html", context)
