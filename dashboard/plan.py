"""The plan page (/finance/plan/), finance staff only: the latest plan
run's demand forecast per pool and model (tokens an hour, the two weeks
before and the 30 days after, with 80% and 95% bands), each series'
method and backtest error, its peak; each pool's GPUs needed against held
with its flags and money; each tier's and model's price floor beside
today's price; each replica's capacity at its SLO with its latency curve;
and the runs, with their progress while one goes (the page refreshes
itself). A run is queued here with finance's choices, never computed in
the request."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.shortcuts import redirect, render

from billing.choices import RunStatus
from core.api_errors import api_error_items
from dashboard.portal import energy_rows
from metering.selectors.usage import energy_totals
from planning.api.serializers import PlanRunIn, WhatIfIn
from planning.floors import KINDS
from planning.provisioning import sized_peak
from planning.runs import PlanRunMissing, plan_run_create, what_if_run_create
from planning.selectors import (
    capacity_list,
    floor_list,
    forecast_list,
    plan_run_latest_done,
    plan_run_list,
    pool_plan_list,
)
from planning.tasks import plan_run_enqueue
from tenants.access import finance_staff_required
from tenants.selectors import tenant_list_for_finance


def forecast_chart(forecast) -> dict:
    """A forecast as Chart.js data: the recent history, the forecast, and
    its bands as filled areas (the upper bound filled down to the lower)."""
    recent = forecast.recent
    ahead = len(forecast.point)
    first = forecast.start - timedelta(hours=len(recent))
    labels = [
        (first + timedelta(hours=h)).strftime("%m-%d %H:00") for h in range(len(recent) + ahead)
    ]
    before, after = [None] * len(recent), [None] * ahead

    def band(values, label, colour, fill):
        return {
            "label": label,
            "data": before + values,
            "borderWidth": 0,
            "pointRadius": 0,
            "backgroundColor": colour,
            "fill": fill,
        }

    low95, high95 = forecast.bands["95"]
    low80, high80 = forecast.bands["80"]
    return {
        "labels": labels,
        "datasets": [
            {
                "label": "seen",
                "data": recent + after,
                "borderColor": "#1f2430",
                "pointRadius": 0,
                "borderWidth": 1,
            },
            {
                "label": "forecast",
                "data": before + forecast.point,
                "borderColor": "#2a6fdb",
                "pointRadius": 0,
                "borderWidth": 1,
            },
            band(high95, "95% band", "rgba(42,111,219,0.12)", "+1"),
            band(low95, "95% low", "rgba(42,111,219,0.12)", False),
            band(high80, "80% band", "rgba(42,111,219,0.25)", "+1"),
            band(low80, "80% low", "rgba(42,111,219,0.25)", False),
        ],
    }


def capacity_chart(estimate) -> dict:
    """A replica's latency against load as Chart.js data: TTFT and
    inter-token p95 per load bin, and the targets as flat lines."""
    labels = [f"{point['tokens_per_hour']:,.0f}" for point in estimate.curve]
    flat = len(labels)

    def line(label, values, colour, dash=None):
        return {
            "label": label,
            "data": values,
            "borderColor": colour,
            "pointRadius": 2,
            "borderWidth": 1,
            **({"borderDash": dash, "pointRadius": 0} if dash else {}),
        }

    datasets = [
        line("TTFT p95 (ms)", [p["ttft_p95_ms"] for p in estimate.curve], "#2a6fdb"),
        line("inter-token p95 (ms)", [p["itl_p95_ms"] for p in estimate.curve], "#d9822b"),
    ]
    if estimate.ttft_target_ms is not None:
        datasets.append(
            line("TTFT target", [float(estimate.ttft_target_ms)] * flat, "#2a6fdb", [4, 4])
        )
    if estimate.itl_target_ms is not None:
        datasets.append(
            line("inter-token target", [float(estimate.itl_target_ms)] * flat, "#d9822b", [4, 4])
        )
    return {"labels": labels, "datasets": datasets}


def capacity_rows(run) -> list[dict]:
    """The run's capacity estimates, each with its chart (when it has a curve)."""
    return [
        {"estimate": e, "chart": capacity_chart(e), "name": f"capacity-{e.pk}"}
        for e in capacity_list(run=run)
    ]


def floor_rows(run) -> list[dict]:
    """The run's floors, each with (kind, today's price, floor) per token kind."""
    return [
        {"floor": f, "kinds": [(k, f.today.get(k), (f.floor or {}).get(k)) for k in KINDS]}
        for f in floor_list(run=run)
    ]


def energy_context(run) -> dict:
    """Energy and emissions per tenant and model over the 30 days before
    the run (each pool's idle draw beside them), and their totals."""
    if run is None:
        return {"energy": []}
    end = run.as_of.replace(minute=0, second=0, microsecond=0)
    rows = energy_rows(energy_totals(tenant=None, start=end - timedelta(days=30), end=end))
    used = [r for r in rows if r["tenant"]]
    return {
        "energy": rows,
        "energy_by_tenant": True,
        "energy_used_kwh": sum((r["kwh"] for r in used), 0),
        "energy_idle_kwh": sum((r["kwh"] for r in rows if not r["tenant"]), 0),
        "energy_co2e_kg": sum((r["co2e_g"] for r in rows), 0) / 1000,
    }


def what_if_params(post) -> dict:
    """The page's what-if form as planning.api.serializers.WhatIfIn takes it: only the
    parts filled in."""
    params: dict = {}
    if post.get("tenant") or post.get("to_pool"):
        params["move_tenant"] = {"tenant": post.get("tenant", ""), "pool": post.get("to_pool", "")}
    if post.get("gpus_pool") or post.get("gpus_delta"):
        params["gpus"] = [{"pool": post.get("gpus_pool", ""), "delta": post.get("gpus_delta")}]
    if post.get("price_model") or post.get("price_percent"):
        params["prices"] = [
            {
                "tier": post.get("price_tier", ""),
                "model": post.get("price_model", ""),
                "percent": post.get("price_percent"),
            }
        ]
    return params


def _first_error(errors) -> str:
    """'field.sub: message' of the first error of a serializer."""
    flat = list(api_error_items(errors))
    first = flat[0]
    return f"{first['field']}: {first['message']}" if first["field"] else first["message"]


def side_by_side(run) -> list[dict]:
    """Each pool of a what-if run beside the same pool in its baseline."""
    if run is None or run.baseline_id is None:
        return []
    before = {p.pool_name: p for p in pool_plan_list(run=run.baseline)}
    return [
        {"pool": p.pool_name, "before": before.get(p.pool_name), "after": p}
        for p in pool_plan_list(run=run)
    ]


@finance_staff_required
def plan_page(request):
    if request.method == "POST" and request.POST.get("action") == "what_if":
        form = WhatIfIn(data=what_if_params(request.POST))
        if not form.is_valid():
            messages.error(request, _first_error(form.errors))
            return redirect("plan")
        try:
            run = what_if_run_create(form.validated_data, user=request.user)
        except PlanRunMissing as exc:
            messages.error(request, str(exc))
            return redirect("plan")
        plan_run_enqueue(run.pk)
        messages.success(request, f"What-if {run.pk} queued.")
        return redirect("plan")
    if request.method == "POST":
        form = PlanRunIn(data=request.POST)
        if not form.is_valid():
            field, errors = next(iter(form.errors.items()))
            messages.error(request, f"{field}: {errors[0]}")
            return redirect("plan")
        run = plan_run_create(user=request.user, **form.validated_data)
        plan_run_enqueue(run.pk)
        messages.success(request, f"Plan run {run.pk} queued.")
        return redirect("plan")
    runs = list(plan_run_list()[:10])
    latest = plan_run_latest_done(what_ifs=False)
    what_if = latest.what_ifs.filter(status="done").order_by("-pk").first() if latest else None
    series = []
    if latest is not None:
        for forecast in forecast_list(run=latest, metric="tokens"):
            # The peak the plan sized GPUs for (the run's band), the one source.
            sized, hour = sized_peak(forecast.point, forecast.bands, latest.band)
            series.append(
                {
                    "forecast": forecast,
                    "error": forecast.mase.get(forecast.method),
                    "total": sum(forecast.point),
                    "peak_point": max(forecast.point, default=0),
                    "peak": sized,
                    "peak_at": forecast.start + timedelta(hours=hour or 0),
                    "chart": forecast_chart(forecast),
                    "name": f"forecast-{forecast.pk}",
                }
            )
    context = {
        "runs": runs,
        "latest": latest,
        "series": series,
        "pools": pool_plan_list(run=latest) if latest else [],
        "floors": floor_rows(latest) if latest else [],
        "capacities": capacity_rows(latest) if latest else [],
        "what_if": what_if,
        "side_by_side": side_by_side(what_if),
        "tenants": list(tenant_list_for_finance().values_list("slug", flat=True)),
        "pool_names": [p.pool_name for p in pool_plan_list(run=latest)] if latest else [],
        "floor_models": sorted({f.model_name for f in floor_list(run=latest)}) if latest else [],
        **energy_context(latest),
        "active": any(r.status in (RunStatus.QUEUED, RunStatus.RUNNING) for r in runs),
        "messages": messages.get_messages(request),
    }
    return render(request, "dashboard/plan.html", context)
