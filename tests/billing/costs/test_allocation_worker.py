"""A Celery worker killed (SIGKILL) in the middle of an allocation run
leaves every day whole, old or new; the run re-run completes it, with no
duplicate rows."""

from __future__ import annotations

import os
import signal
import time
from datetime import timedelta

import pytest

from billing.costs.runs import allocation_run_create
from billing.models import AllocationRun, CostAllocation, PoolHourCost
from billing.tasks import allocation_run_task
from tests.billing.conftest import H0, make_world
from tests.celery_worker import Worker, worker_wait
from tests.services import database_session

DAYS = 6


def _colocation_by_day() -> list[set]:
    """Per day of the period, the set of other-opex amounts its pool-hours hold."""
    start = H0.replace(hour=0)
    return [
        set(
            PoolHourCost.objects.filter(
                hour__gte=start + timedelta(days=d), hour__lt=start + timedelta(days=d + 1)
            ).values_list("other_opex", flat=True)
        )
        for d in range(DAYS)
    ]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_run_loses_nothing_and_a_rerun_completes(tmp_path):
    world = make_world()
    pool = world.pool("shared")
    replica = world.replica("r1", pool, [world.gpu("g1"), world.gpu("g2")])
    start, end = H0.replace(hour=0), H0.replace(hour=0) + timedelta(days=DAYS)
    for hour in range(0, DAYS * 24, 5):
        world.use(world.a, replica, 1800, hour=start + timedelta(hours=hour))
        world.use(world.b, replica, 600, hour=start + timedelta(hours=hour))
    world.allocate(start=start, end=end)  # booked with no overheads
    booked_rows = CostAllocation.objects.count()
    world.rate("colocation", "720", "per_gpu_hour", effective_from=start)  # a correction

    # Hold day 4's rows so the worker blocks there, with days 1-3 rewritten.
    locker = database_session()
    day4 = start + timedelta(days=3)
    locker.execute(
        "SELECT 1 FROM billing_poolhourcost WHERE hour >= %s AND hour < %s FOR UPDATE",
        [day4, day4 + timedelta(days=1)],
    )
    worker = Worker("filesystem", tmp_path).start()
    try:
        run = allocation_run_create(start=start, end=end)
        worker.send(allocation_run_task, run.pk)
        worker_wait(lambda: AllocationRun.objects.get(pk=run.pk).hours_done == 72, worker)
        time.sleep(0.5)  # blocked on day 4
        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait(timeout=30)
    finally:
        locker.rollback()
        locker.close()
        worker.stop()

    # Whole days only: the first three new (with colocation), the rest as booked.
    per_day = _colocation_by_day()
    assert per_day[:3] == [{1440}] * 3, per_day
    assert per_day[3:] == [{0}] * (DAYS - 3), per_day
    assert PoolHourCost.objects.count() == DAYS * 24
    assert CostAllocation.objects.count() == booked_rows
    assert AllocationRun.objects.get(pk=run.pk).status == "running"  # its worker died

    # The job re-run by a fresh worker: complete, no duplicates.
    rerun = allocation_run_create(start=start, end=end)
    worker = Worker("filesystem", tmp_path).start()
    try:
        worker.send(allocation_run_task, rerun.pk)
        worker_wait(lambda: AllocationRun.objects.get(pk=rerun.pk).status == "done", worker)
    finally:
        worker.stop()
    assert _colocation_by_day() == [{1440}] * DAYS
    assert PoolHourCost.objects.count() == DAYS * 24
    assert CostAllocation.objects.count() == booked_rows
    abandoned = AllocationRun.objects.get(pk=run.pk)
    assert abandoned.status == "failed" and "abandoned" in abandoned.error
