"""What allocation reads, aggregated in SQL: where each GPU sits and what it
cost to buy or lease, each replica's busy device-seconds per hour, each
pool's use per (hour, tenant, model), and reservations. Usage comes from
the hourly rollups, read through metering.selectors.totals.usage_device_frame,
never from raw events."""

from __future__ import annotations

from datetime import UTC, datetime, time, timedelta

import numpy as np
import pandas as pd

from billing.costs.cost_model import HOUR, FleetArrays
from core.calendar import months_add
from core.nanos import to_nano
from serving.gpu_shares import GPU_UNITS
from serving.models import Gpu, Pool, ReplicaGpu, Reservation

US = 1_000_000


def fleet_placement() -> pd.DataFrame:
    """One row per piece of a GPU (MIG and time-sliced shares): a GPU held whole, or by no
    replica, is one piece; a MIG-partitioned or time-sliced GPU is a piece
    per replica's share and, for what no replica holds, a piece in the
    pool of its lowest-numbered replica (that pool's idle capacity). Each
    row: the GPU's cost facts and power draw, the piece's pool, replica
    and GPU units (serving.gpu_shares: a piece costs its GPU's cost x
    units / GPU_UNITS), and `last`, the GPU's last piece, which takes what
    splitting its capital left over so that its pieces add up to it."""
    shares: dict[int, list[tuple[int, int, int]]] = {}
    for gpu_id, replica_id, pool_id, units in ReplicaGpu.objects.values_list(
        "gpu_id", "replica_id", "replica__pool_id", "units"
    ).order_by("replica_id"):
        shares.setdefault(gpu_id, []).append((replica_id, pool_id, units))
    rows = []
    for gpu in Gpu.objects.select_related("sku", "node").order_by("pk"):
        owned = gpu.capex is not None
        start = datetime.combine(gpu.in_service_date, time(), tzinfo=UTC)
        life_hours = (
            int(
                (months_add(gpu.in_service_date, gpu.useful_life_months) - gpu.in_service_date)
                / timedelta(hours=1)
            )
            if owned
            else 0
        )
        facts = {
            "gpu_id": gpu.pk,
            "in_service": int(start.timestamp()),
            "life_hours": life_hours,
            "depreciable_nano": to_nano(gpu.capex - gpu.salvage_value) if owned else 0,
            "lease_nano_per_hour": 0 if owned else to_nano(gpu.lease_rate_per_hour),
            "idle_watts": gpu.sku.power_idle_watts,
            "busy_watts": gpu.sku.power_busy_watts,
            "currency": gpu.currency,
            "site": gpu.node.site,
        }
        held = shares.get(gpu.pk, [])
        pieces = list(held)
        unheld = GPU_UNITS - sum(units for _, _, units in held)
        if unheld > 0:
            pieces.append((-1, held[0][1] if held else None, unheld))
        for n, (replica_id, pool_id, units) in enumerate(pieces):
            rows.append(
                {
                    **facts,
                    "pool_id": pool_id,
                    "replica_id": replica_id,
                    "units": units,
                    "last": n == len(pieces) - 1,
                }
            )
    return pd.DataFrame(rows, columns=PLACEMENT_COLUMNS)


PLACEMENT_COLUMNS = [
    "gpu_id",
    "pool_id",
    "replica_id",
    "units",
    "last",
    "in_service",
    "life_hours",
    "depreciable_nano",
    "lease_nano_per_hour",
    "idle_watts",
    "busy_watts",
    "currency",  # of the GPU's capex, salvage or lease
    "site",  # its node's: where its grid intensity is read
]


def fleet_arrays(
    placement: pd.DataFrame, *, scope: np.ndarray, currency: str | None = None
) -> FleetArrays:
    """The placement as the cost model's arrays; with `currency`, the
    capital of GPUs priced in another currency left out (zero)."""
    _, gpu = np.unique(placement["gpu_id"].to_numpy(np.int64), return_inverse=True)
    mine = (
        np.ones(len(placement), dtype=bool)
        if currency is None
        else (placement["currency"] == currency).to_numpy()
    )
    return FleetArrays(
        scope=scope,
        gpu=gpu.astype(np.int64),
        units=placement["units"].to_numpy(np.int64),
        last=placement["last"].to_numpy(bool),
        in_service=placement["in_service"].to_numpy(np.int64),
        life_hours=placement["life_hours"].to_numpy(np.int64),
        depreciable_nano=np.where(mine, placement["depreciable_nano"].to_numpy(np.int64), 0),
        lease_nano_per_hour=np.where(mine, placement["lease_nano_per_hour"].to_numpy(np.int64), 0),
        idle_watts=placement["idle_watts"].to_numpy(np.int64),
        busy_watts=placement["busy_watts"].to_numpy(np.int64),
    )


def replica_busy_seconds(rollups: pd.DataFrame) -> pd.DataFrame:
    """(hour, replica_id, seconds) of attributed device time."""
    held = rollups[rollups["replica_id"] >= 0]
    busy = held.groupby(["hour", "replica_id"], as_index=False, sort=False)["device_us"].sum()
    return busy.assign(seconds=busy["device_us"] / US).drop(columns="device_us")


def pool_usage(rollups: pd.DataFrame) -> pd.DataFrame:
    """(hour, pool_id, tenant, model, seconds, device_us) of device time
    used in each pool."""
    pooled = rollups[rollups["pool_id"] >= 0]
    keys = ["hour", "pool_id", "tenant", "model"]
    used = pooled.groupby(keys, as_index=False, sort=False)["device_us"].sum()
    return used.assign(seconds=used["device_us"] / US)


def reservations_overlapping(*, start: datetime, end: datetime) -> pd.DataFrame:
    """(pool_id, tenant, start, end epoch seconds, gpus) of reservations in force."""
    rows = Reservation.objects.filter(start__lt=end, end__gt=start).values_list(
        "pool_id", "tenant_id", "start", "end", "gpu_count"
    )
    return pd.DataFrame(
        [(p, t, int(s.timestamp()), int(e.timestamp()), n) for p, t, s, e, n in rows],
        columns=["pool_id", "tenant", "start", "end", "gpus"],
    )


def reservation_seconds(reservations: pd.DataFrame, *, hours: np.ndarray) -> pd.DataFrame:
    """(hour epoch, pool_id, tenant, seconds): reserved GPU-seconds of each
    reservation in each of `hours` it overlaps (partial hours pro rata)."""
    parts = []
    for r in reservations.itertuples(index=False):
        overlap = np.clip(np.minimum(hours + HOUR, r.end) - np.maximum(hours, r.start), 0, None)
        hit = overlap > 0
        parts.append(
            pd.DataFrame(
                {
                    "hour": hours[hit],
                    "pool_id": r.pool_id,
                    "tenant": r.tenant,
                    "seconds": overlap[hit] * r.gpus,
                }
            )
        )
    if not parts:
        return pd.DataFrame({"hour": [], "pool_id": [], "tenant": [], "seconds": []}).astype(
            {"hour": np.int64, "pool_id": np.int64, "tenant": np.int64, "seconds": np.int64}
        )
    return pd.concat(parts, ignore_index=True)


def pools_by_id() -> dict[int, Pool]:
    return {pool.pk: pool for pool in Pool.objects.all()}
