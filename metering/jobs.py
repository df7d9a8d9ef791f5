"""The metering pipeline's periodic work, each step safe to re-run:
attribute the windows that are due, then rebuild the hours whose usage
changed."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings

from core.locks import advisory_lock_try
from metering.rollups import usage_rollup_hours, usage_rollups_refresh
from metering.windows import (
    attribution_batches,
    attribution_windows_compute,
    attribution_windows_due,
)

logger = logging.getLogger(__name__)
RUN_LOCK = "metering_run"  # one metering run at a time, across workers


@dataclass
class MeteringRun:
    windows: int = 0
    still_pending: int = 0
    hours: list[datetime] = field(default_factory=list)
    skipped: bool = False


def metering_run(*, now: datetime | None = None, progress=None) -> MeteringRun:
    """One pass of the pipeline. A run still going when the next is due (a
    backlog after an outage) makes the next one a no-op rather than a
    second worker redoing the same windows."""
    with advisory_lock_try(RUN_LOCK) as locked:
        if not locked:
            logger.info("metering run skipped: another run is in progress")
            return MeteringRun(skipped=True)
        return _metering_run(now=now, progress=progress)


def _metering_run(*, now: datetime | None, progress) -> MeteringRun:
    if settings.USAGE_LOG["URL"]:  # the scaled path: the store, on the Dask cluster
        from metering.log.distributed import dask_client, store_rollups_rebuild
        from metering.log.distributed import store_windows_compute as compute

        with dask_client() as client:
            return _run(
                now=now,
                progress=progress,
                compute=lambda window_ids: compute(window_ids=window_ids, client=client),
                rebuild=store_rollups_rebuild(client=client),
            )
    return _run(
        now=now,
        progress=progress,
        compute=lambda window_ids: attribution_windows_compute(window_ids=window_ids),
        rebuild=usage_rollup_hours,
    )


def _run(*, now: datetime | None, progress, compute, rebuild) -> MeteringRun:
    run = MeteringRun()
    due = attribution_windows_due(now=now)
    for batch in attribution_batches(due):
        outcomes = compute(batch)
        run.windows += len(outcomes)
        run.still_pending += sum(o.still_pending for o in outcomes)
        if progress is not None:
            progress(run.windows, len(due))
    run.hours = usage_rollups_refresh(rebuild=rebuild)
    logger.info(
        "metering run: %d windows attributed (%d pending again), %d hours rolled up",
        run.windows,
        run.still_pending,
        len(run.hours),
    )
    return run
