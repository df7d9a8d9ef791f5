"""What the forecast month will cost, pool by pool: the cost model that
allocation books with (billing.costs: capital, energy by utilisation and
PUE, other opex, at the rates in force) run over the horizon's hours, each
replica as busy as the forecast demand makes it. Demand becomes device
time at each pool's and model's device-seconds per token of the weeks
before; a (pool, model) series' device time is spread over its replicas by
their GPU units."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd

from billing.costs.period import allocation_book, stretch_gpu_costs
from serving.gpu_shares import GPU_UNITS
from serving.models import Replica

HOUR = 3600


@dataclass(frozen=True)
class PoolCost:
    """One pool over the horizon: its GPUs (pieces' units over GPU_UNITS),
    their GPU-hours in service, what they cost (nano-units of the
    reporting currency) and how busy the forecast keeps them."""

    pool_id: int
    gpus: float
    gpu_hours: float
    cost_nano: int
    busy_share: float

    @property
    def per_gpu_hour_nano(self) -> float:
        return self.cost_nano / self.gpu_hours if self.gpu_hours else 0.0


def fleet_shape() -> tuple[dict[int, float], dict[int, tuple[int, int]]]:
    """Each replica holding GPUs: its GPUs, and its (pool, model)."""
    from billing.costs.inputs import fleet_placement

    placement = fleet_placement()
    held = placement[placement["replica_id"] >= 0]
    gpus = (held.groupby("replica_id")["units"].sum() / GPU_UNITS).to_dict()
    models = {
        pk: (pool, model)
        for pk, pool, model in Replica.objects.filter(pk__in=list(gpus)).values_list(
            "pk", "pool_id", "model_id"
        )
    }
    return {int(k): float(v) for k, v in gpus.items()}, models


def replica_device_seconds(
    demand: dict[tuple[int, int], np.ndarray],
    *,
    seconds_per_token: dict[tuple[int, int], float],
    replica_gpus: dict[int, float],
    replica_models: dict[int, tuple[int, int]],
    start: datetime,
) -> pd.DataFrame:
    """(hour epoch, replica_id, device_us): each (pool, model) series' tokens
    an hour as device time, spread over its replicas by their GPUs."""
    first = int(start.astimezone(UTC).timestamp())
    frames = []
    for key, tokens in demand.items():
        replicas = [r for r, placed in replica_models.items() if placed == key]
        if not replicas:
            continue
        total = sum(replica_gpus[r] for r in replicas)
        seconds = np.clip(tokens, 0, None) * seconds_per_token.get(key, 0.0)
        hours = first + HOUR * np.arange(len(tokens), dtype=np.int64)
        for replica in replicas:
            share = replica_gpus[replica] / total
            frames.append(
                pd.DataFrame(
                    {
                        "hour": hours,
                        "replica_id": np.full(len(tokens), replica, dtype=np.int64),
                        "device_us": np.rint(seconds * share * 1e6).astype(np.int64),
                    }
                )
            )
    if not frames:
        return pd.DataFrame({"hour": [], "replica_id": [], "device_us": []}, dtype=np.int64)
    return pd.concat(frames, ignore_index=True)


def forecast_costs(
    *, start: datetime, hours: int, device: pd.DataFrame, replica_pools: dict[int, int]
) -> dict[int, PoolCost]:
    """Each pool's cost over [start, start + hours) with `device` (hour
    epoch, replica_id, device_us) as its replicas' busy time
    (`replica_pools`: replica -> pool). Raises FxRateMissingError where a
    cost entered in another currency has no rate near enough."""
    book = allocation_book(start=start, end=start + timedelta(hours=hours))
    costs = stretch_gpu_costs(book, 0, len(book.hours), device)
    per_piece = (costs.capital + costs.energy + costs.other_opex).sum(axis=1, dtype=np.int64)
    placement = book.placement
    units = placement["units"].to_numpy(np.float64)
    gpu_hours = (costs.in_service * (units / GPU_UNITS)[:, None]).sum(axis=1)
    replica_gpus = placement[placement["replica_id"] >= 0].groupby("replica_id")["units"].sum()
    busy: dict[int, float] = {}  # pool -> busy GPU-hours (each replica-hour at most its GPUs)
    for replica, us in device.groupby("replica_id")["device_us"]:
        if replica not in replica_gpus.index or replica not in replica_pools:
            continue
        gpus = replica_gpus[replica] / GPU_UNITS
        hours_busy = np.minimum(us.to_numpy() / 1e6 / HOUR, gpus).sum()
        busy[replica_pools[replica]] = busy.get(replica_pools[replica], 0.0) + hours_busy
    pools: dict[int, PoolCost] = {}
    for pool_id, rows in placement.groupby("pool_id", dropna=True).groups.items():
        idx = np.asarray(rows)
        in_service = float(gpu_hours[idx].sum())
        pools[int(pool_id)] = PoolCost(
            pool_id=int(pool_id),
            gpus=float(units[idx].sum() / GPU_UNITS),
            gpu_hours=in_service,
            cost_nano=int(per_piece[idx].sum()),
            busy_share=busy.get(int(pool_id), 0.0) / in_service if in_service else 0.0,
        )
    return pools
