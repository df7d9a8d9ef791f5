"""What-ifs on a plan: the same forecast month with one or more changes,
shown side by side with the plan it changes (PlanRun.baseline).

- move a tenant to another pool: its share of each (pool, model) series
  (its tokens' share over the weeks before) leaves that pool's series and
  joins the target pool's series of the same model;
- add or remove GPUs in a pool: its GPUs, GPU-hours and cost change by
  the pool's own cost per GPU-hour (the cost model's, at the forecast
  utilisation), its need is measured against the new count;
- change a price: a tier's model's prices by a percent, every kind alike.

`what_if` as stored: {"move_tenant": {"tenant": slug, "pool": name},
"gpus": [{"pool": name, "delta": n}], "prices": [{"tier": t, "model": m,
"percent": p}]}, each part optional; the API checks it (planning.api.serializers)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import numpy as np

from planning.costs import PoolCost
from planning.demand import SeriesForecast


def _scaled(series: SeriesForecast, factor: float, *, pool_id: int, pool: str) -> SeriesForecast:
    forecast = series.forecast
    moved = replace(
        forecast,
        point=np.asarray(forecast.point) * factor,
        bands={
            k: (np.asarray(lo) * factor, np.asarray(hi) * factor)
            for k, (lo, hi) in forecast.bands.items()
        },
    )
    return replace(
        series, forecast=moved, pool_id=pool_id, pool=pool, history=series.history * factor
    )


def tenant_moved(
    tokens: dict[tuple, SeriesForecast],
    *,
    shares: dict[tuple, float],
    to_pool_id: int,
    to_pool: str,
) -> dict[tuple, SeriesForecast]:
    """`shares`: (pool, model) -> the tenant's share of that series."""
    out = dict(tokens)
    for (pool_id, model_id), share in shares.items():
        series = tokens.get((pool_id, model_id))
        if series is None or pool_id == to_pool_id or share <= 0:
            continue
        out[(pool_id, model_id)] = _scaled(series, 1 - share, pool_id=pool_id, pool=series.pool)
        moved = _scaled(series, share, pool_id=to_pool_id, pool=to_pool)
        there = out.get((to_pool_id, model_id))
        if there is not None:
            moved = replace(
                there,
                forecast=replace(
                    there.forecast,
                    point=np.asarray(there.forecast.point) + moved.forecast.point,
                    bands={
                        k: (
                            np.asarray(lo) + moved.forecast.bands[k][0],
                            np.asarray(hi) + moved.forecast.bands[k][1],
                        )
                        for k, (lo, hi) in there.forecast.bands.items()
                    },
                ),
            )
        out[(to_pool_id, model_id)] = moved
    return out


def gpus_changed(cost: PoolCost, delta: int, *, hours: int) -> PoolCost:
    """The pool with `delta` GPUs more (or fewer), each at its cost per GPU-hour."""
    gpus = max(cost.gpus + delta, 0.0)
    gpu_hours = cost.gpu_hours + delta * hours if cost.gpus + delta > 0 else 0.0
    gpu_hours = max(gpu_hours, 0.0)
    busy_hours = cost.busy_share * cost.gpu_hours
    return PoolCost(
        pool_id=cost.pool_id,
        gpus=gpus,
        gpu_hours=gpu_hours,
        cost_nano=round(cost.per_gpu_hour_nano * gpu_hours),
        busy_share=min(busy_hours / gpu_hours, 1.0) if gpu_hours else 0.0,
    )


def price_changes(what_if: dict) -> dict[tuple[str, str], Decimal]:
    return {(p["tier"], p["model"]): Decimal(str(p["percent"])) for p in what_if.get("prices", [])}
