"""What pages and the API read of plans."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.choices import RunStatus
from planning.models import CapacityEstimate, DemandForecast, PlanRun, PoolPlan, PriceFloor


def plan_run_list() -> QuerySet[PlanRun]:
    return PlanRun.objects.all()


def plan_run_latest_done(*, what_ifs: bool = True) -> PlanRun | None:
    """The latest done plan run (`what_ifs` False: of the plans as things are)."""
    runs = PlanRun.objects.filter(status=RunStatus.DONE)
    if not what_ifs:
        runs = runs.filter(baseline__isnull=True)
    return runs.order_by("-as_of", "-pk").first()


def forecast_list(*, run: PlanRun, **filters) -> QuerySet[DemandForecast]:
    """The run's forecasts, narrowed by pool_name, model_name or metric."""
    return DemandForecast.objects.filter(run=run, **{k: v for k, v in filters.items() if v})


def capacity_list(*, run: PlanRun) -> QuerySet[CapacityEstimate]:
    return CapacityEstimate.objects.filter(run=run)


def pool_plan_list(*, run: PlanRun) -> QuerySet[PoolPlan]:
    return PoolPlan.objects.filter(run=run).select_related("run")


def floor_list(*, run: PlanRun) -> QuerySet[PriceFloor]:
    return PriceFloor.objects.filter(run=run).select_related("run")


def plan_summary_text(run: PlanRun) -> str:
    """One line of a done run: its series, their backtest error (the
    chosen methods' MASE, median and worst), and each pool's flags."""
    errors = sorted(
        f.mase[f.method]
        for f in DemandForecast.objects.filter(run=run, metric="tokens")
        if f.mase.get(f.method) is not None
    )
    backtest = (
        f"backtest MASE median {errors[len(errors) // 2]:.2f}, worst {errors[-1]:.2f}"
        if errors
        else "no backtest (history too thin)"
    )
    pools = ", ".join(f"{p.pool_name} {'/'.join(p.flags)}" for p in pool_plan_list(run=run))
    return f"{run.series_total} pools' and models' demand forecast ({backtest}); pools: {pools}"
