"""The fleet page for finance staff: pools (GPUs, replicas up of all,
utilization and cost over the last day), replicas up or down, GPUs with
their cost facts, reservations, the booked cost rates, and each
replica's latency against load with its capacity at SLO, from the latest
plan run."""

from __future__ import annotations

from datetime import timedelta

from django.shortcuts import render
from django.utils import timezone

from billing.costs.selectors import cost_rate_booked_list, pool_utilization_summary
from dashboard.plan import capacity_rows
from planning.selectors import plan_run_latest_done
from serving.selectors import (
    gpus_overview,
    pools_overview,
    replicas_overview,
    reservations_overview,
)
from tenants.access import finance_staff_required


@finance_staff_required
def fleet(request):
    now = timezone.now()
    end = now.replace(minute=0, second=0, microsecond=0)
    day = {
        row["pool"]: row for row in pool_utilization_summary(start=end - timedelta(days=1), end=end)
    }
    pools = list(pools_overview())
    for pool in pools:
        pool.last_day = day.get(pool.name)
    plan = plan_run_latest_done()
    context = {
        "plan": plan,
        "capacities": capacity_rows(plan) if plan else [],
        "pools": pools,
        "replicas": replicas_overview(),
        "gpus": gpus_overview(),
        "reservations": reservations_overview(now=now),
        "rates": cost_rate_booked_list(),
        "now": now,
    }
    return render(request, "dashboard/fleet.html", context)
