"""The scaled path's attribution as jobs on Dask distributed: per replica,
a task on a worker reads its requests from the raw-event store (only the
hours it needs) and attributes its windows with the one attribution
(metering.windows.replica_compute); the caller (a Celery task) stores each
replica's windows in PostgreSQL in one transaction, replacing them whole.

A worker lost mid-task (killed, its machine gone) is the scheduler's to
handle: the task is pure, so it runs again on another worker and gives
the same result. Re-attribution with another policy, a backfill, a year
of what-ifs: the same jobs over more windows.

USAGE_DASK_SCHEDULER names the scheduler (tcp://host:8786); without it an
in-process cluster of threads does the work (a developer's machine)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from distributed import Client, as_completed
from django.conf import settings

from metering.log.frames import store_events_frames
from metering.log.rollups import store_rollup_rows
from metering.log.store import RawStore
from metering.log.stream import LogConfig
from metering.rollups import rollup_hours_kept, usage_rollup_hours_from
from metering.windows import (
    ReplicaComputed,
    ReplicaShape,
    WindowOutcome,
    WindowSpec,
    attribution_windows_by_replica,
    replica_compute,
    replica_shape,
    replica_store,
    window_specs,
)

logger = logging.getLogger(__name__)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def dask_client(address: str | None = None) -> Client:
    """A client of the scheduler settings name, or of a cluster in this process."""
    address = address if address is not None else settings.USAGE_LOG["DASK_SCHEDULER"]
    if address:
        return Client(address, timeout=30)
    # The client owns the in-process cluster: closed with it.
    return Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None)


def replica_attribute(
    *,
    store_url: str,
    stream: str,
    replica_id: int,
    windows: list[WindowSpec],
    shape: ReplicaShape,
    policy: str,
    max_request_seconds: int,
) -> ReplicaComputed:
    """On a worker: one replica's windows attributed from the store."""
    start = EPOCH + timedelta(microseconds=min(w.start_us for w in windows))
    end = EPOCH + timedelta(microseconds=max(w.end_us for w in windows))
    frame = store_events_frames(
        RawStore(store_url, stream=stream),
        replica_ids=[replica_id],
        start=start,
        end=end,
        max_request_seconds=max_request_seconds,
    )[replica_id]
    return replica_compute(frame, windows, shape, policy=policy)


def store_windows_compute(
    *,
    window_ids: list[int],
    client: Client,
    policy: str | None = None,
    config: LogConfig | None = None,
) -> list[WindowOutcome]:
    """Attribute `window_ids` on the cluster and store them, a replica at a
    time as its task completes (see metering.windows.attribution_windows_compute,
    the ledger's path). `config`: the store's (settings' by default)."""
    policy = policy or settings.METERING["ATTRIBUTION_POLICY"]
    config = config or LogConfig.from_settings()
    futures = {}
    for group in attribution_windows_by_replica(window_ids):
        future = client.submit(
            replica_attribute,
            store_url=config.store_url,
            stream=config.stream,
            replica_id=group[0].replica_id,
            windows=window_specs(group),
            shape=replica_shape(group[0]),
            policy=policy,
            max_request_seconds=settings.METERING["MAX_REQUEST_SECONDS"],
            pure=False,
            retries=2,
        )
        futures[future] = group
    outcomes: list[WindowOutcome] = []
    for future in as_completed(futures):
        outcomes += replica_store(futures[future], future.result(), policy=policy)
    return outcomes


def store_rollups_rebuild(*, client: Client, config: LogConfig | None = None):
    """A `rebuild` for metering.rollups.usage_rollups_refresh: a batch of
    hours summed over the store on a worker, written here."""
    config = config or LogConfig.from_settings()

    def rebuild(*, hours: list[datetime]) -> int:
        hours = rollup_hours_kept(hours)
        if not hours:
            return 0
        usage, load = client.submit(
            store_rollup_rows,
            store_url=config.store_url,
            stream=config.stream,
            hours=hours,
            max_request_seconds=settings.METERING["MAX_REQUEST_SECONDS"],
            pure=False,
            retries=2,
        ).result()
        return usage_rollup_hours_from(hours=hours, usage_rows=usage, load_rows=load)

    return rebuild
