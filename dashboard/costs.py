"""The finance dashboard's cost page: allocation runs with their progress
(refreshing itself while one is going), cost by tier split into what
tenants carry and what stays unallocated (idle), and utilization by pool,
over the period and hour by hour or day by day as a chart."""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone

from billing.choices import RunStatus
from billing.costs.selectors import (
    allocation_run_list,
    pool_utilization_series,
    pool_utilization_summary,
    unallocated_summary,
)
from dashboard.forms import PeriodFilterForm
from tenants.access import finance_staff_required

PERIODS = {"7": 7, "30": 30, "90": 90, "365": 365}


@finance_staff_required
def costs(request):
    return costs_page(request)


def costs_page(request, *, error: str = "", http_status: int = 200):
    """The page, with a run form's error when there is one."""
    days = PeriodFilterForm(request.GET, periods=PERIODS, default=7).days_value()
    end = timezone.now().replace(minute=0, second=0, microsecond=0)
    start = end - timedelta(days=days)
    tiers = unallocated_summary(start=start, end=end, group_by="tier")
    widest = max((row["total"] for row in tiers), default=0) or 1
    for row in tiers:
        row["allocated"] = row["total"] - row["unallocated"]
        # ok-float: bar widths in percent
        row["allocated_pct"] = float(row["allocated"] / widest * 100)  # ok-float
        row["unallocated_pct"] = float(row["unallocated"] / widest * 100)  # ok-float
    pools = pool_utilization_summary(start=start, end=end)
    for row in pools:
        row["pct"] = row["utilization"] * 100
    series = pool_utilization_series(start=start, end=end, bucket="hour" if days <= 7 else "day")
    runs = list(allocation_run_list()[:20])
    context = {
        "days": days,
        "periods": PERIODS,
        "start": start,
        "end": end,
        "tiers": tiers,
        "pools": pools,
        "series": series,
        "runs": runs,
        "active": any(r.status in (RunStatus.QUEUED, RunStatus.RUNNING) for r in runs),
        "error": error,
        "run_form": request.POST
        if error
        else {"first_day": f"{end:%Y-%m}-01", "last_day": f"{end:%Y-%m-%d}"},
    }
    return render(request, "dashboard/costs.html", context, status=http_status)
