"""Celery tasks of planning: a plan run asked for, and the weekly one."""

from __future__ import annotations

from celery import shared_task

from billing.runs import run_enqueue, run_task, runs_abandoned_fail
from planning.models import PlanRun
from planning.runs import plan_run_create, plan_run_execute


@shared_task(
    name="planning.plan_run",
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=1800,
    soft_time_limit=1740,
    ignore_result=True,
)
def plan_run_task(run_id: int) -> str:
    with run_task(PlanRun, run_id):
        return plan_run_execute(run_id=run_id).status


def plan_run_enqueue(run_id: int) -> None:
    run_enqueue(plan_run_task, PlanRun, run_id, what="plan run", error=str)


@shared_task(name="planning.plan_weekly", time_limit=1800, soft_time_limit=1740, ignore_result=True)
def plan_weekly_task() -> str:
    """Mondays, after the weekly margin flash: the plan as of now."""
    run = plan_run_create()
    with run_task(PlanRun, run.pk):
        return plan_run_execute(run_id=run.pk).status


@shared_task(name="planning.runs_abandoned", ignore_result=True)
def runs_abandoned_task() -> int:
    """Plan runs whose worker died, marked failed (billing.runs)."""
    return runs_abandoned_fail(PlanRun)
