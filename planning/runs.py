"""Plan runs: asked for (the page, the API, the weekly schedule), then
executed by a worker (planning.tasks) with progress a person watches:
every pool's and model's demand forecast (planning.demand), written with
the run's end in one transaction."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from billing.runs import run_executing, run_finish, run_progress, run_start
from core.errors import ServiceError
from core.nanos import from_nano
from planning.demand import demand_forecasts
from planning.floors import KINDS
from planning.forecast import HORIZON
from planning.models import CapacityEstimate, DemandForecast, PlanRun, PoolPlan, PriceFloor
from planning.plan import CENTS, Plan, plan_compute
from planning.selectors import plan_run_latest_done

RECENT_HOURS = 14 * 24  # the history a forecast keeps for its chart
PLACES = 3  # forecasts are estimates: three decimals of a token or request an hour


class PlanRunMissing(ServiceError):
    """No plan run has finished yet to base a what-if on."""


def plan_run_create(*, as_of: datetime | None = None, user=None, **choices) -> PlanRun:
    """`choices`: band, headroom_percent, target_margin_percent (the
    model's defaults where not given)."""
    return PlanRun.objects.create(
        as_of=as_of or timezone.now(), horizon_hours=HORIZON, requested_by=user, **choices
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
        plan = plan_compute(
            as_of=run.as_of,
            horizon=run.horizon_hours,
            forecasts=found,
            band=run.band,
            headroom_percent=run.headroom_percent,
            target_margin_percent=run.target_margin_percent,
            what_if=run.what_if,
        )
        with transaction.atomic():
            for table in (DemandForecast, CapacityEstimate, PoolPlan, PriceFloor):
                table.objects.filter(run=run).delete()  # a second delivery rewrites
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
            _plan_write(run, plan)
            run_finish(run)
    return run


def _text(prices, *, plain: bool = False) -> dict | None:
    """Prices by kind as text: as entered (`plain`: 0.25, not 0.250000000), or as computed."""
    if prices is None:
        return None
    return {k: f"{prices.of(k).normalize() if plain else prices.of(k):f}" for k in KINDS}


def _plan_write(run: PlanRun, plan: Plan) -> None:
    run.currency = plan.currency
    run.warnings = plan.warnings
    run.save(update_fields=["currency", "warnings"])
    CapacityEstimate.objects.bulk_create(
        CapacityEstimate(
            run=run,
            replica=c.replica,
            replica_name=c.replica.name,
            pool_name=c.replica.pool.name,
            model_name=c.replica.model.name,
            gpus=Decimal(str(round(c.gpus, 3))),
            ttft_target_ms=c.slo.ttft_ms,
            itl_target_ms=c.slo.itl_ms,
            status=c.capacity.status,
            tokens_per_hour=None
            if c.capacity.tokens_per_hour is None
            else round(c.capacity.tokens_per_hour),
            hours=c.capacity.hours,
            note=c.capacity.note[:300],
            curve=c.capacity.curve,
        )
        for c in plan.capacities
    )
    PoolPlan.objects.bulk_create(
        PoolPlan(
            run=run,
            pool=p.pool,
            pool_name=p.pool.name,
            kind=p.pool.kind,
            gpus_held=Decimal(str(round(p.need.gpus_held, 3))),
            gpus_needed=None if p.need.gpus_needed is None else Decimal(str(p.need.gpus_needed)),
            gpus_contracted=None
            if p.need.gpus_contracted is None
            else Decimal(str(p.need.gpus_contracted)),
            flags=p.need.flags,
            busy_percent=None
            if p.cost is None
            else Decimal(str(round(p.cost.busy_share * 100, 2))),
            cost=None if p.cost is None else from_nano(p.cost.cost_nano).quantize(CENTS),
            idle_cost=p.idle_cost,
            credits_at_risk=p.credits_at_risk,
            revenue=p.revenue,
            margin_percent=p.margin_percent,
            headroom_percent=None
            if p.need.headroom_percent is None
            else Decimal(str(round(p.need.headroom_percent, 1))),
            by_model=[m.as_json() for m in p.need.models],
        )
        for p in plan.pools
    )
    PriceFloor.objects.bulk_create(
        PriceFloor(
            run=run,
            tier=f.tier,
            model_name=f.model,
            tokens=f.tokens,
            today=_text(f.today, plain=True) or {},
            floor=_text(f.floor.floor) if f.floor else None,
            cost=f.floor.cost.quantize(CENTS) if f.floor else Decimal(0),
            revenue=f.floor.revenue.quantize(CENTS) if f.floor else Decimal(0),
            margin_percent=f.floor.margin_percent if f.floor else None,
            note=(f.floor.note if f.floor else f.note)[:300],
        )
        for f in plan.floors
    )


def what_if_run_create(params: dict, *, user) -> PlanRun:
    """A what-if run on `params["baseline"]` (default: the latest done
    plan that is not one), with its as-of and choices (PlanRunMissing with none)."""
    if "baseline" in params:
        baseline = PlanRun.objects.get(pk=params["baseline"])
    else:
        baseline = plan_run_latest_done(what_ifs=False)
        if baseline is None:
            raise PlanRunMissing("no plan run has finished yet: queue one")
    changes = {
        "move_tenant": params.get("move_tenant"),
        "gpus": [dict(g) for g in params.get("gpus", [])],
        "prices": [{**p, "percent": f"{p['percent']}"} for p in params.get("prices", [])],
    }
    return plan_run_create(
        as_of=baseline.as_of,
        user=user,
        band=baseline.band,
        headroom_percent=baseline.headroom_percent,
        target_margin_percent=baseline.target_margin_percent,
        what_if={k: v for k, v in changes.items() if v},
        baseline=baseline,
    )
