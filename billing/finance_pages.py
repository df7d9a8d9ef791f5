"""The finance overview: revenue, cost and margin by tier this month so far
against last month (a chart), unabsorbed idle cost, and margin by tenant
and by model (sortable). It reads the stored month-to-date margin report
(computed nightly, or on request), never rating live, so it stays fast."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from billing.choices import ReportKind, RunStatus
from billing.models import MarginReport
from tenants.access import principal_for_session


@login_required
def finance_overview(request):
    principal = principal_for_session(request)
    if principal is None or not principal.is_finance:
        raise PermissionDenied
    done = MarginReport.objects.filter(status=RunStatus.DONE).defer("csv", "html")
    # This month so far if it was computed, else the newest report.
    report = (
        done.filter(kind=ReportKind.MONTH_TO_DATE).order_by("-period_end").first()
        or done.order_by("-period_end", "-finished_at").first()
    )
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
