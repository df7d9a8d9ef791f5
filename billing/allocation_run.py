"""The allocation job: one period, booked or for a scenario, computed
vectorised and written day by day, each day replaced in one transaction.
Safe to re-run: a run killed half-way leaves whole days, and the next run
rewrites every day of its period."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.utils import timezone

from billing.allocation import COMPONENTS, NO_OWNER, PoolHours, allocate, pool_hour_allocated
from billing.choices import RunStatus
from billing.cost_inputs import (
    fleet_arrays,
    fleet_placement,
    pool_usage,
    pools_by_id,
    replica_busy_seconds,
    reservation_seconds,
)
from billing.cost_model import HOUR, gpu_hour_costs
from billing.models import AllocationRun, CostAllocation, CostScenario, PoolHourCost
from billing.money import NANO
from billing.rates import RateScope, rate_arrays, rates_in_force
from config.db_copy import copy_rows
from serving.choices import IdleCostPolicy, PoolKind

logger = logging.getLogger(__name__)

MAX_PERIOD = timedelta(days=366)
Progress = Callable[[int, int], None]


def allocation_run_create(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None, user=None
) -> AllocationRun:
    """A queued run of [start, end), whole UTC hours."""
    for name, moment in (("start", start), ("end", end)):
        if moment.tzinfo is None:
            raise ValidationError({name: "must carry a timezone"})
        if moment.astimezone(UTC) != _hour_floor(moment):
            raise ValidationError({name: "must be a whole hour (UTC)"})
    if end <= start:
        raise ValidationError({"end": "must be after start"})
    if end - start > MAX_PERIOD:
        raise ValidationError({"end": "a run covers at most 366 days"})
    hours = int((end - start) / timedelta(hours=1))
    return AllocationRun.objects.create(
        start=start, end=end, scenario=scenario, requested_by=user, hours_total=hours
    )


def allocation_run_execute(*, run_id: int, progress: Progress | None = None) -> AllocationRun:
    """Compute and write a run's period. Runs of the same book (booked, or
    one scenario) take turns; a failure is recorded on the run and raised."""
    run = AllocationRun.objects.select_related("scenario").get(pk=run_id)
    key = f"billing_allocation:{run.scenario_id or 'booked'}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtext(%s))", [key])
    try:
        # Holding the book's lock, no other run of it is alive: one still
        # marked running lost its worker.
        AllocationRun.objects.filter(scenario_id=run.scenario_id, status=RunStatus.RUNNING).exclude(
            pk=run.pk
        ).update(
            status=RunStatus.FAILED,
            error="abandoned: its worker stopped before finishing (re-run to complete)",
            finished_at=timezone.now(),
        )
        AllocationRun.objects.filter(pk=run.pk).update(
            status=RunStatus.RUNNING,
            started_at=timezone.now(),
            hours_done=0,
            error="",
            finished_at=None,
        )
        try:
            warnings = _execute(run, progress=progress)
        except Exception as exc:
            AllocationRun.objects.filter(pk=run.pk).update(
                status=RunStatus.FAILED,
                error=f"{type(exc).__name__}: {exc}",
                finished_at=timezone.now(),
            )
            raise
        AllocationRun.objects.filter(pk=run.pk).update(
            status=RunStatus.DONE, warnings=warnings, finished_at=timezone.now()
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtext(%s))", [key])
    run.refresh_from_db()
    logger.info("allocation run %s: %s", run.pk, run)
    return run


def _execute(run: AllocationRun, *, progress: Progress | None) -> list[str]:
    result = allocation_compute(start=run.start, end=run.end, scenario=run.scenario)
    hours_total = len(result.hours)
    done = 0
    for day_start in range(0, hours_total, 24):
        day = result.hours[day_start : day_start + 24]
        _write_day(run, result, first=int(day[0]), last=int(day[-1]))
        done += len(day)
        AllocationRun.objects.filter(pk=run.pk).update(hours_done=done)
        if progress is not None:
            progress(done, hours_total)
    return result.warnings


class AllocationResult:
    """A period's pool-hour costs and allocation rows, ready to write."""

    def __init__(self, hours, pool_hours: pd.DataFrame, rows: pd.DataFrame, warnings):
        self.hours = hours
        self.pool_hours = pool_hours
        self.rows = rows
        self.warnings = warnings


def allocation_compute(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None
) -> AllocationResult:
    """Everything a run writes, computed without writing anything."""
    hours = np.arange(int(start.timestamp()), int(end.timestamp()), HOUR, dtype=np.int64)
    pools = pools_by_id()
    placement = fleet_placement()
    scopes = [RateScope(None, "GPUs held by no replica")] + [
        RateScope(pool.pk, f"pool {pool.name}") for pool in pools.values()
    ]
    scope_of_pool = {scope.pool_id: i for i, scope in enumerate(scopes)}
    gpu_scope = np.array(
        [scope_of_pool.get(p if pd.notna(p) else None, 0) for p in placement["pool_id"]],
        dtype=np.int64,
    )
    rates, warnings = rate_arrays(
        rates=rates_in_force(start=start, end=end, scenario=scenario), scopes=scopes, hours=hours
    )
    costs = gpu_hour_costs(
        fleet=fleet_arrays(placement, scope=gpu_scope),
        rates=rates,
        hours=hours,
        busy_fraction=_busy_fraction(placement, hours, start=start, end=end),
    )

    # Pool-hours: (scope x hour) sums over the GPUs in each scope.
    n_scopes = len(scopes)
    per_scope = {
        name: _scope_sum(getattr(costs, name), gpu_scope, n_scopes)
        for name in (*COMPONENTS, "in_service", "fully_depreciated")
    }
    cell_scope, cell_hour = np.nonzero(per_scope["in_service"] > 0)
    pool_ids = np.array([scopes[s].pool_id or 0 for s in cell_scope], dtype=np.int64)
    kinds = [pools[p].kind if p else "" for p in pool_ids]
    policy = scenario.idle_cost_policy if scenario and scenario.idle_cost_policy else None
    spread = np.array(
        [
            bool(p) and (policy or pools[p].idle_cost_policy) == IdleCostPolicy.SPREAD
            for p in pool_ids
        ],
        dtype=bool,
    )
    gpus = per_scope["in_service"][cell_scope, cell_hour]
    ph = PoolHours(
        owner=np.array(
            [
                pools[p].owner_id if p and pools[p].kind == PoolKind.DEDICATED else NO_OWNER
                for p in pool_ids
            ],
            dtype=np.int64,
        ),
        reserved=np.array([k == PoolKind.RESERVED for k in kinds], dtype=bool),
        spread_idle=spread,
        capacity_seconds=gpus.astype(np.float64) * HOUR,
        **{c: per_scope[c][cell_scope, cell_hour] for c in COMPONENTS},
    )
    # Spare GPUs (scope 0) are never anybody's: their pool-hours take no use.
    index = pd.DataFrame({"ph": np.arange(len(ph)), "pool_id": pool_ids, "hour": hours[cell_hour]})
    index = index[index["pool_id"] != 0]
    usage = pool_usage(start=start, end=end).merge(index, on=["hour", "pool_id"])
    held = reservation_seconds(start=start, end=end, hours=hours).merge(
        index, on=["hour", "pool_id"]
    )
    rows = allocate(ph, usage, held)
    rows = rows.merge(
        usage[["ph", "tenant", "model", "device_us"]], on=["ph", "tenant", "model"], how="left"
    )
    rows["device_us"] = rows["device_us"].fillna(0).astype(np.int64)
    rows["hour"] = hours[cell_hour][rows["ph"].to_numpy()]
    rows["pool_id"] = pool_ids[rows["ph"].to_numpy()]
    rows["pool_kind"] = [kinds[i] for i in rows["ph"].to_numpy()]

    total = ph.total
    allocated = pool_hour_allocated(ph, rows)
    busy_us = np.zeros(len(ph), dtype=np.int64)
    np.add.at(busy_us, usage["ph"].to_numpy(), usage["device_us"].to_numpy())
    pool_hours = pd.DataFrame(
        {
            "hour": hours[cell_hour],
            "pool_id": pool_ids,
            "pool_kind": kinds,
            "gpus": gpus,
            "fully_depreciated_gpus": per_scope["fully_depreciated"][cell_scope, cell_hour],
            "capacity_us": gpus * HOUR * 1_000_000,
            "busy_us": busy_us,
            **{c: per_scope[c][cell_scope, cell_hour] for c in COMPONENTS},
            "total": total,
            "allocated": allocated,
            "unallocated": total - allocated,
        }
    )
    return AllocationResult(hours, pool_hours, rows, warnings)


def _busy_fraction(placement: pd.DataFrame, hours: np.ndarray, *, start, end) -> np.ndarray:
    """GPUs x hours: the replica holding each GPU, busy device-seconds over
    its GPUs' capacity."""
    busy = np.zeros((len(placement), len(hours)))
    replica_ids = placement["replica_id"].to_numpy()
    held = replica_ids >= 0
    if not held.any():
        return busy
    seconds = replica_busy_seconds(start=start, end=end)
    gpu_count = pd.Series(replica_ids[held]).value_counts()
    seconds = seconds[seconds["replica_id"].isin(gpu_count.index)]
    replica_index = {r: i for i, r in enumerate(gpu_count.index)}
    per_replica = np.zeros((len(replica_index), len(hours)))
    rows = seconds["replica_id"].map(replica_index).to_numpy()
    cols = (seconds["hour"].to_numpy() - hours[0]) // HOUR
    per_replica[rows, cols] = seconds["seconds"].to_numpy() / (
        gpu_count.loc[seconds["replica_id"]].to_numpy() * HOUR
    )
    busy[held] = per_replica[[replica_index[r] for r in replica_ids[held]]]
    return busy


def _scope_sum(values: np.ndarray, scope: np.ndarray, n_scopes: int) -> np.ndarray:
    out = np.zeros((n_scopes, values.shape[1]), dtype=np.int64)
    for s in np.unique(scope):
        out[s] = values[scope == s].sum(axis=0, dtype=np.int64)
    return out


def _hour_floor(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


POOL_HOUR_COLUMNS = [
    "scenario_id",
    "hour",
    "pool_id",
    "pool_kind",
    "gpus",
    "fully_depreciated_gpus",
    "capacity_seconds",
    "busy_seconds",
    "capital",
    "energy",
    "other_opex",
    "total",
    "allocated",
    "unallocated",
]
ALLOCATION_COLUMNS = [
    "scenario_id",
    "hour",
    "tenant_id",
    "pool_id",
    "pool_kind",
    "served_model_id",
    "device_seconds",
    "capital",
    "energy",
    "other_opex",
    "idle",
    "total",
]


def _write_day(run: AllocationRun, result: AllocationResult, *, first: int, last: int) -> None:
    """Replace one day's rows of the run's book, all or nothing."""
    start = datetime.fromtimestamp(first, UTC)
    end = datetime.fromtimestamp(last + HOUR, UTC)
    book = {"scenario_id": run.scenario_id}
    ph = result.pool_hours
    ph = ph[(ph["hour"] >= first) & (ph["hour"] <= last)]
    rows = result.rows
    rows = rows[(rows["hour"] >= first) & (rows["hour"] <= last)]
    with transaction.atomic():
        PoolHourCost.objects.filter(**book, hour__gte=start, hour__lt=end).delete()
        CostAllocation.objects.filter(**book, hour__gte=start, hour__lt=end).delete()
        with connection.cursor() as cursor:
            copy_rows(
                cursor.cursor,
                table=PoolHourCost._meta.db_table,
                columns=POOL_HOUR_COLUMNS,
                rows=_pool_hour_tuples(run.scenario_id, ph),
            )
            copy_rows(
                cursor.cursor,
                table=CostAllocation._meta.db_table,
                columns=ALLOCATION_COLUMNS,
                rows=_allocation_tuples(run.scenario_id, rows),
            )


def _when(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


def _money(nano) -> str:
    nano = int(nano)
    sign = "-" if nano < 0 else ""
    whole, frac = divmod(abs(nano), NANO)
    return f"{sign}{whole}.{frac:09d}"


def _seconds(us) -> str:
    whole, frac = divmod(int(us), 1_000_000)
    return f"{whole}.{frac:06d}"


def _pool_hour_tuples(scenario_id, ph: pd.DataFrame):
    for r in ph.itertuples(index=False):
        yield (
            scenario_id,
            _when(r.hour),
            r.pool_id or None,
            r.pool_kind,
            int(r.gpus),
            int(r.fully_depreciated_gpus),
            _seconds(r.capacity_us),
            _seconds(r.busy_us),
            _money(r.capital),
            _money(r.energy),
            _money(r.other_opex),
            _money(r.total),
            _money(r.allocated),
            _money(r.unallocated),
        )


def _allocation_tuples(scenario_id, rows: pd.DataFrame):
    for r in rows.itertuples(index=False):
        total = r.capital + r.energy + r.other_opex + r.idle
        yield (
            scenario_id,
            _when(r.hour),
            int(r.tenant),
            int(r.pool_id),
            r.pool_kind,
            None if r.model == -1 else int(r.model),
            _seconds(r.device_us),
            _money(r.capital),
            _money(r.energy),
            _money(r.other_opex),
            _money(r.idle),
            _money(total),
        )
