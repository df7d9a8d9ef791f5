"""The allocation job: one period, booked or for a scenario, computed
vectorised and written day by day, each day replaced in one transaction.
Safe to re-run: a run killed half-way leaves whole days, and the next run
rewrites every day of its period."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import numpy as np
from django.core.exceptions import ValidationError
from django.utils import timezone

from billing.costs.cost_model import HOUR
from billing.costs.period import allocation_book, allocation_stretch
from billing.costs.store import (
    allocation_day_replace,
    allocation_days,
    allocation_hours_clear,
    allocation_hours_held,
    allocation_table,
    energy_table,
    pool_hour_table,
)
from billing.models import AllocationRun, CostScenario
from billing.runs import run_executing, run_finish, run_progress, run_start, runs_abandoned_fail
from core.calendar import OUT_OF_RANGE, hour_start, moment_supported
from core.locks import advisory_lock
from metering.selectors.totals import usage_device_frame

logger = logging.getLogger(__name__)

MAX_PERIOD = timedelta(days=366)
STRETCH_HOURS = 7 * 24  # computed at once; a multiple of 24 (days are written whole)
Progress = Callable[[int, int], None]


def allocation_period(*, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """The period a run of [start, end) books: whole UTC hours within the
    supported span (core.calendar), stopping at the current hour (hours
    still to come have no usage yet: booking them books idle cost that no
    later run would correct). The one rule of the API, the page's form and
    the commands; ValidationError naming `start` or `end`."""
    for name, moment in (("start", start), ("end", end)):
        if moment.tzinfo is None:
            raise ValidationError({name: "must carry a timezone"})
        if moment.astimezone(UTC) != hour_start(moment):
            raise ValidationError({name: "must be a whole hour (UTC)"})
    if not moment_supported(start):
        raise ValidationError({"start": OUT_OF_RANGE})
    if end <= start:
        raise ValidationError({"end": "must be after start"})
    now_hour = hour_start(timezone.now())
    if start >= now_hour:
        raise ValidationError({"start": "must be before the current hour"})
    end = min(end.astimezone(UTC), now_hour)
    if not moment_supported(end):
        raise ValidationError({"end": OUT_OF_RANGE})
    if end - start > MAX_PERIOD:
        raise ValidationError({"end": "a run covers at most 366 days"})
    return start, end


def allocation_run_create(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None, user=None
) -> AllocationRun:
    """A queued run of [start, end), cut by allocation_period."""
    start, end = allocation_period(start=start, end=end)
    hours = int((end - start) / timedelta(hours=1))
    return AllocationRun.objects.create(
        start=start, end=end, scenario=scenario, requested_by=user, hours_total=hours
    )


def allocation_run_execute(*, run_id: int, progress: Progress | None = None) -> AllocationRun:
    """Compute and write a run's period. Runs of the same book (booked, or
    one scenario) take turns; a failure is recorded on the run and raised."""
    run = AllocationRun.objects.select_related("scenario").get(pk=run_id)
    key = f"billing_allocation:{run.scenario_id or 'booked'}"
    runs_abandoned_fail(AllocationRun)
    with advisory_lock(key), run_executing(run):
        run_start(run, hours_done=0, error="", finished_at=None)
        try:
            warnings = _execute(run, progress=progress)
        except Exception as exc:
            run_finish(run, failed=True, error=f"{type(exc).__name__}: {exc}")
            raise
        run_finish(run, warnings=warnings)
    run.refresh_from_db()
    logger.info("allocation run %s: %s", run.pk, run)
    return run


def _execute(run: AllocationRun, *, progress: Progress | None) -> list[str]:
    """A week at a time: while the main thread writes one week (all the
    database work stays on it), a worker thread computes the next, and
    memory stays bounded by a week however long the period."""
    book = allocation_book(start=run.start, end=run.end, scenario=run.scenario)
    hours_total = len(book.hours)
    stretches = [
        (first, min(first + STRETCH_HOURS, hours_total))
        for first in range(0, hours_total, STRETCH_HOURS)
    ]
    # Days the book already holds rows for (a re-run): only they are deleted
    # before being written (the book's lock keeps other writers out).
    held = allocation_hours_held(scenario_id=run.scenario_id, start=run.start, end=run.end)
    # No hour from the current one on is booked: rows a run wrote for hours
    # that had not happened (before runs stopped at the current hour) go,
    # whichever days they fall on, so that a later, shorter run leaves none.
    allocation_hours_clear(scenario_id=run.scenario_id, after=hour_start(timezone.now()))
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="allocation") as worker:

        def prepare(first: int, stop: int):
            rollups = usage_device_frame(
                start=_at(book.hours[first]), end=_at(book.hours[stop - 1] + HOUR)
            )
            return worker.submit(_days, book, first, stop, rollups, run.scenario_id)

        pending = prepare(*stretches[0])
        for n in range(len(stretches)):
            days = pending.result()
            if n + 1 < len(stretches):
                pending = prepare(*stretches[n + 1])
            for day in days:
                done = int(np.searchsorted(book.hours, day.last_hour)) + 1
                allocation_day_replace(
                    scenario_id=run.scenario_id,
                    day=day,
                    replace=any(day.first_hour <= h <= day.last_hour for h in held),
                    then=lambda done=done: run_progress(run, hours_done=done),
                )
                if progress is not None:
                    progress(done, hours_total)
    return book.warnings


def _days(book, first: int, stop: int, rollups, scenario_id):
    """Compute a stretch and shape its rows for COPY, a day at a time (pure:
    no database; on the worker thread, so that the writing thread only
    writes)."""
    result = allocation_stretch(book, first, stop, rollups)
    return allocation_days(
        pool_hour_table(result.pool_hours, scenario_id=scenario_id),
        allocation_table(result.rows, scenario_id=scenario_id),
        hours=book.hours[first:stop],
        energy=energy_table(result.energy) if result.energy is not None else None,
    )


def _at(epoch) -> datetime:
    return datetime.fromtimestamp(int(epoch), UTC)
