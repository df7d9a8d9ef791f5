"""What pages and the API read of plans."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.choices import RunStatus
from planning.models import DemandForecast, PlanRun


def plan_run_list() -> QuerySet[PlanRun]:
    return PlanRun.objects.all()


def plan_run_latest_done() -> PlanRun | None:
    return PlanRun.objects.filter(status=RunStatus.DONE).order_by("-as_of", "-pk").first()


def forecast_list(*, run: PlanRun, **filters) -> QuerySet[DemandForecast]:
    """The run's forecasts, narrowed by pool_name, model_name or metric."""
    return DemandForecast.objects.filter(run=run, **{k: v for k, v in filters.items() if v})
