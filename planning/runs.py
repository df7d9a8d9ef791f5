"""Plan runs: asked for (the page, the API, the weekly schedule), then
executed by a worker (planning.tasks) with progress a person watches:
every pool's and model's demand forecast (planning.demand), written with
the run's end in one transaction."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.runs import run_executing, run_finish, run_progress, run_start
from planning.demand import demand_forecasts
from planning.forecast import HORIZON
from planning.models import DemandForecast, PlanRun

RECENT_HOURS = 14 * 24  # the history a forecast keeps for its chart
PLACES = 3  # forecasts are estimates: three decimals of a token or request an hour


def plan_run_create(*, as_of: datetime | None = None, user=None) -> PlanRun:
    return PlanRun.objects.create(
        as_of=as_of or timezone.now(), horizon_hours=HORIZON, requested_by=user
    )


def _rounded(values) -> list[float]:
    return [round(float(v), PLACES) for v in values]


def plan_run_execute(*, run_id: int) -> PlanRun:
    """Forecast every series; the run done with its forecasts, or failed
    with the error and none of them."""
    run = PlanRun.objects.get(pk=run_id)
    with run_executing(run):
        run_start(run, series_done=0, series_total=0)
        found = demand_forecasts(
            now=run.as_of,
            horizon=run.horizon_hours,
            progress=lambda done, total: run_progress(run, series_done=done, series_total=total),
        )
        with transaction.atomic():
            DemandForecast.objects.filter(run=run).delete()  # a second delivery rewrites
            DemandForecast.objects.bulk_create(
                DemandForecast(
                    run=run,
                    pool_id=s.pool_id,
                    pool_name=s.pool,
                    model_name=s.model,
                    metric=s.metric,
                    method=s.forecast.method,
                    mase={
                        k: round(v, 4) if v != float("inf") else None
                        for k, v in s.forecast.mase.items()
                    },
                    start=s.start,
                    point=_rounded(s.forecast.point),
                    bands={
                        k: [_rounded(lo), _rounded(hi)] for k, (lo, hi) in s.forecast.bands.items()
                    },
                    recent=_rounded(s.history[-RECENT_HOURS:]),
                )
                for s in found
            )
            run_finish(run)
    return run
