"""Finance compares platforms: for each engine (vLLM, TensorRT-LLM, ...)
and each kind of GPU a replica runs on (a SKU held whole, a MIG profile of
one, a time-sliced share), what a million tokens cost and what a GPU-hour
earned, as operators compare serving stacks.

Cost is the cost model's own, piece by piece (billing.costs: each piece of
a GPU a replica holds costs its GPU's cost x units / 700), so a replica's
cost is its GPUs' whatever its pool; the pieces no replica holds (slices
of a partitioned GPU left free, GPUs no replica runs on) are their own
rows, engine "(none)". Revenue is the margin report's (per tenant, pool
and model, in the reporting currency) split over the replicas of that pool
that served the model by the tenant's attributed device-seconds on each
(exactly, by largest remainder); revenue with no usage behind it (a
dedicated pool's fee in a quiet month) by the replicas' GPU units; revenue
tied to no pool (a commitment's true-up) stays on a "(no replica)" row.
Tokens are billed tokens (a disaggregated request once). So revenue and
cost add up to the report's totals, less the unabsorbed-idle and spare
split the report shows by pool.

That is the replica-level view (the overview's). A model's drill-down
(model_platform_frame) shows the model's own figures instead: its margin
rows (revenue naming it, the cost allocation booked to it) placed on the
engine and GPU kind of the replicas that served it in each pool, so they
add up to the model's margin row."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd

from billing.costs.allocation import COMPONENTS
from billing.costs.period import allocation_book, stretch_gpu_costs
from core.nanos import NANO
from metering.apportion import apportion
from metering.selectors.totals import (
    usage_by_model_pool_replica,
    usage_by_replica,
    usage_device_frame,
)
from serving.choices import Engine, GpuSharing
from serving.gpu_shares import GPU_UNITS
from serving.models import Gpu, Pool, Replica, ReplicaGpu
from tenants.models import Tenant

NONE, NO_REPLICA = "(none)", "(no replica)"
PLATFORM_KEYS = ["engine", "gpu_kind"]
COLUMNS = ["model", *PLATFORM_KEYS, "gpu_hours", "busy_hours", "tokens", "revenue", "cost"]


def platform_frame(*, start: datetime, end: datetime, revenue: pd.DataFrame) -> pd.DataFrame:
    """One row per replica and per piece no replica holds: model, engine,
    gpu_kind, GPU-hours, busy (attributed) hours, tokens, revenue and cost
    (nano-units). `revenue`: rows of pool, tenant, model, revenue (names,
    as margin data has them)."""
    device = usage_device_frame(start=start, end=end)
    pieces = _pieces(start=start, end=end, device=device)
    if pieces.empty:
        return pd.DataFrame(columns=COLUMNS)
    groups = _revenue_groups(revenue)
    replicas = pieces[pieces["replica_id"] >= 0]
    usage = _usage(start=start, end=end)
    per_replica = (
        replicas.groupby(["replica_id", "model", "engine"], as_index=False)
        .agg(
            gpu_kind=("gpu_kind", lambda kinds: " + ".join(sorted(set(kinds)))),
            gpu_hours=("gpu_hours", "sum"),
            cost=("cost", "sum"),
            units=("units", "sum"),
            pool=("pool", "first"),
        )
        .merge(usage, on="replica_id", how="left")
    )
    per_replica[["tokens", "busy_hours"]] = per_replica[["tokens", "busy_hours"]].fillna(0)
    per_replica["revenue"] = _revenue_per_replica(per_replica, groups, _tenant_device(device))
    spare = pieces[pieces["replica_id"] < 0].assign(
        model="", engine=NONE, tokens=0, busy_hours=0.0, revenue=0
    )
    unplaced = _unplaced_revenue(per_replica, groups)
    frame = pd.concat([per_replica, spare, unplaced], ignore_index=True)[COLUMNS]
    frame[["tokens", "revenue", "cost"]] = frame[["tokens", "revenue", "cost"]].astype(np.int64)
    return frame


def model_platform_frame(*, start: datetime, end: datetime, detail: pd.DataFrame) -> pd.DataFrame:
    """Each model's own figures by engine and GPU kind: per (model, pool) of
    the margin detail (billing.reports.margins), its revenue (rows naming
    the model), its allocated cost (capital, energy, other opex, idle
    carried: as the model's margin row counts it) and its tokens, split
    over the replicas of that pool that served the model by the model's
    device-seconds on each (exactly, by largest remainder; else evenly
    over the pool's replicas of the model; tokens by the model's tokens on
    each); what no replica served stays
    on a "(no replica)" row. GPU-hours (and busy hours) are the model's own
    device-hours on each replica. Rows: model, engine, gpu_kind,
    gpu_hours, busy_hours, tokens, revenue, cost (nano-units); per model
    they sum exactly to the model's margin row."""
    figures = _model_figures(detail)
    device = _model_device(start=start, end=end)
    if figures.empty and device.empty:
        return pd.DataFrame(columns=COLUMNS)
    facts = _replica_facts()
    served: dict[tuple[str, str], list[int]] = {}
    for replica_id, (pool, model, _engine, _kind) in facts.items():
        served.setdefault((model, pool), []).append(replica_id)
    on_replica: dict[tuple[str, str], dict[int, int]] = {}
    tokens_on: dict[tuple[str, str], dict[int, int]] = {}
    for model, pool, replica_id, device_us, tokens in device.itertuples(index=False):
        on_replica.setdefault((model, pool), {})[int(replica_id)] = int(device_us)
        tokens_on.setdefault((model, pool), {})[int(replica_id)] = int(tokens)
    rows = []
    for key in sorted(set(figures.index) | set(on_replica)):
        model, pool = key
        amounts = figures.loc[key] if key in figures.index else None
        used = {r: us for r, us in on_replica.get(key, {}).items() if r in facts}
        ids = sorted(used) if sum(used.values()) else sorted(served.get(key, []))
        weights = np.array([used.get(r, 1) for r in ids], dtype=np.float64)
        if not ids:  # no replica of that pool served the model: no platform
            ids, weights = [-1], np.ones(1)
        # Tokens where they ran (the model's own on each replica), money
        # by device-seconds.
        counted = np.array([tokens_on.get(key, {}).get(r, 0) for r in ids], dtype=np.float64)
        by = {"tokens": counted if counted.sum() else weights}
        parts = {
            column: _split(int(amounts[column]), by.get(column, weights))
            if amounts is not None
            else np.zeros(len(ids), dtype=np.int64)
            for column in ("tokens", "revenue", "cost")
        }
        for i, replica_id in enumerate(ids):
            engine, kind = facts[replica_id][2:] if replica_id >= 0 else (NO_REPLICA, "")
            hours = used.get(replica_id, 0) / 3.6e9  # ok-float: device-hours, a ratio
            rows.append(
                {"model": model, "engine": engine, "gpu_kind": kind}
                | {"gpu_hours": hours, "busy_hours": hours}
                | {column: int(parts[column][i]) for column in parts}
            )
    frame = pd.DataFrame(rows, columns=COLUMNS)
    frame[["tokens", "revenue", "cost"]] = frame[["tokens", "revenue", "cost"]].astype(np.int64)
    return frame


def _model_figures(detail: pd.DataFrame) -> pd.DataFrame:
    """Revenue, cost (every cost column, as margin_table sums it) and
    tokens per (model, pool) of the margin detail's rows naming a model."""
    cost_columns = ["capital", "energy", "other_opex", "idle", "unabsorbed"]
    if detail.empty:
        return pd.DataFrame(columns=["tokens", "revenue", "cost"])
    named = detail[detail["model"] != ""]
    frame = named.assign(cost=named[cost_columns].sum(axis=1))
    sums = frame.groupby(["model", "pool"])[["tokens", "revenue", "cost"]].sum()
    return sums[(sums != 0).any(axis=1)]


def _model_device(*, start: datetime, end: datetime) -> pd.DataFrame:
    """Attributed device-microseconds and billed tokens per (model name,
    pool name, replica) of the rollups that name all three."""
    rows = usage_by_model_pool_replica(start=start, end=end)
    return pd.DataFrame(
        [
            (
                r["served_model__name"],
                r["pool__name"],
                r["replica_id"],
                int((r["device"] or 0) * 10**6),
                int(r["tokens"] or 0),
            )
            for r in rows
        ],
        columns=["model", "pool", "replica_id", "device_us", "tokens"],
    )


def _replica_facts() -> dict[int, tuple[str, str, str, str]]:
    """Per replica: its pool's name, its model's name, its engine and its
    GPU kind (as _pieces names them, joined when it holds several)."""
    kinds: dict[int, set[str]] = {}
    for replica_id, sku, sharing, profile in ReplicaGpu.objects.values_list(
        "replica_id", "gpu__sku__name", "sharing", "mig_profile"
    ):
        kinds.setdefault(replica_id, set()).add(_kind(sku, (sharing, profile), held=True))
    return {
        pk: (pool, model, engine, " + ".join(sorted(kinds.get(pk, ()))))
        for pk, pool, model, engine in Replica.objects.values_list(
            "pk", "pool__name", "model__name", "engine"
        )
    }


def platform_table(frame: pd.DataFrame, keys: list[str] = PLATFORM_KEYS) -> pd.DataFrame:
    """`frame` summed by `keys`, with cost per million tokens, revenue per
    GPU-hour, utilization and margin."""
    table = frame.groupby(keys, as_index=False)[
        ["gpu_hours", "busy_hours", "tokens", "revenue", "cost"]
    ].sum()
    table = table.astype(
        {"gpu_hours": np.float64, "busy_hours": np.float64}
        | {column: np.int64 for column in ("tokens", "revenue", "cost")}
    )
    table["margin"] = table["revenue"] - table["cost"]
    with np.errstate(divide="ignore", invalid="ignore"):
        table["cost_per_mtok"] = np.where(
            table["tokens"] > 0, table["cost"] / table["tokens"] * 1e6 / NANO, np.nan
        )
        table["revenue_per_gpu_hour"] = np.where(
            table["gpu_hours"] > 0, table["revenue"] / NANO / table["gpu_hours"], np.nan
        )
        table["utilization_pct"] = np.where(
            table["gpu_hours"] > 0, table["busy_hours"] / table["gpu_hours"] * 100, np.nan
        )
    table["engine_label"] = table["engine"].map(engine_label)
    return table.sort_values(keys).reset_index(drop=True)


def _pieces(*, start: datetime, end: datetime, device: pd.DataFrame) -> pd.DataFrame:
    """The cost model's pieces of GPUs over [start, end): each one's cost
    (nano), GPU-hours in service, its replica (-1: none), model, engine
    and GPU kind."""
    book = allocation_book(start=start, end=end)
    placement = book.placement
    if not len(book.hours) or placement.empty:
        return pd.DataFrame()
    costs = stretch_gpu_costs(book, 0, len(book.hours), device)
    cost = sum(getattr(costs, name).sum(axis=1) for name in COMPONENTS)
    units = placement["units"].to_numpy(np.int64)
    hours = costs.in_service.sum(axis=1)
    skus = dict(Gpu.objects.values_list("pk", "sku__name"))
    shares = {
        (gpu, replica): (sharing, profile)
        for gpu, replica, sharing, profile in ReplicaGpu.objects.values_list(
            "gpu_id", "replica_id", "sharing", "mig_profile"
        )
    }
    facts = {
        pk: (model, engine)
        for pk, model, engine in Replica.objects.values_list("pk", "model__name", "engine")
    }
    pools = dict(Pool.objects.values_list("pk", "name"))
    gpu_ids = placement["gpu_id"].to_numpy(np.int64)
    replica_ids = placement["replica_id"].to_numpy(np.int64)
    pool_ids = placement["pool_id"].fillna(-1).to_numpy(np.int64)
    return pd.DataFrame(
        {
            "replica_id": replica_ids,
            "model": [facts.get(r, ("", ""))[0] for r in replica_ids],
            "engine": [facts.get(r, ("", NONE))[1] for r in replica_ids],
            "gpu_kind": [
                _kind(skus[g], shares.get((g, r)), held=r >= 0)
                for g, r in zip(gpu_ids, replica_ids, strict=True)
            ],
            "pool": [pools.get(p, "") for p in pool_ids],
            "units": units,
            "gpu_hours": hours * units / GPU_UNITS,
            "cost": np.asarray(cost, dtype=np.int64),
        }
    )


def _kind(sku: str, share: tuple[str, str] | None, *, held: bool) -> str:
    """A GPU kind as finance compares them: the SKU, and how it is cut."""
    if not held:
        return f"{sku} · unheld"
    sharing, profile = share or (GpuSharing.WHOLE, "")
    if sharing == GpuSharing.MIG:
        return f"{sku} · MIG {profile}"
    if sharing == GpuSharing.TIME_SLICED:
        return f"{sku} · time-sliced"
    return sku


def _usage(*, start: datetime, end: datetime) -> pd.DataFrame:
    """Billed tokens and attributed device-hours per replica."""
    return pd.DataFrame(
        [
            {
                "replica_id": r["replica_id"],
                "tokens": int(r["tokens"] or 0),
                "busy_hours": float(r["device_seconds"] or 0) / 3600,  # ok-float: ratios
            }
            for r in usage_by_replica(start=start, end=end)
        ],
        columns=["replica_id", "tokens", "busy_hours"],
    )


def _revenue_per_replica(
    replicas: pd.DataFrame,
    groups: dict[tuple[str, str, str], int],
    device: dict[tuple[int, str], int],
) -> np.ndarray:
    """Each (pool, tenant, model)'s revenue over the replicas of that pool
    serving that model: by the tenant's device-seconds on each, else by
    their GPU units. Exact: the parts add up to the revenue."""
    out = np.zeros(len(replicas), dtype=np.int64)
    index = {rid: i for i, rid in enumerate(replicas["replica_id"])}
    for (pool, tenant, model), amount in groups.items():
        # A fee of the pool's (a dedicated or reserved pool's) names no model.
        serving = replicas[
            (replicas["pool"] == pool) & ((replicas["model"] == model) | (model == ""))
        ]
        if serving.empty or amount == 0:
            continue
        ids = serving["replica_id"].to_numpy()
        weights = np.array([device.get((r, tenant), 0) for r in ids], dtype=np.float64)
        if weights.sum() == 0:
            weights = serving["units"].to_numpy(np.float64)
        parts = _split(amount, weights)
        for rid, part in zip(ids, parts, strict=True):
            out[index[rid]] += part
    return out


def _unplaced_revenue(
    replicas: pd.DataFrame, groups: dict[tuple[str, str, str], int]
) -> pd.DataFrame:
    """Revenue no replica served: tied to no pool, or to a pool and model
    no replica serves now."""
    served = set(zip(replicas["pool"], replicas["model"], strict=True))
    pools = set(replicas["pool"])
    amount = sum(
        value
        for (pool, _tenant, model), value in groups.items()
        if (pool, model) not in served and not (model == "" and pool in pools)
    )
    if not amount:
        return pd.DataFrame(columns=COLUMNS)
    return pd.DataFrame(
        [
            {
                "model": "",
                "engine": NO_REPLICA,
                "gpu_kind": "",
                "gpu_hours": 0.0,
                "busy_hours": 0.0,
                "tokens": 0,
                "revenue": amount,
                "cost": 0,
            }
        ]
    )


def _revenue_groups(revenue: pd.DataFrame) -> dict[tuple[str, str, str], int]:
    if revenue.empty:
        return {}
    sums = revenue.groupby(["pool", "tenant", "model"])["revenue"].sum()
    return {key: int(value) for key, value in sums.items() if value}


def _tenant_device(frame: pd.DataFrame) -> dict[tuple[int, str], int]:
    """Attributed device-microseconds per (replica, tenant slug), from the
    period's usage frame (metering.selectors.totals.usage_device_frame)."""
    if frame.empty:
        return {}
    slugs = dict(Tenant.objects.values_list("pk", "slug"))
    sums = frame.groupby(["replica_id", "tenant"])["device_us"].sum()
    return {(int(r), slugs.get(int(t), "")): int(v) for (r, t), v in sums.items()}


def _split(amount: int, weights: np.ndarray) -> np.ndarray:
    """`amount` (of either sign) in integer parts by `weights`, exactly."""
    share = abs(amount) * weights / weights.sum()
    parts = apportion(share, total=abs(amount))
    return parts if amount >= 0 else -parts


def engine_label(engine: str) -> str:
    """The engine's name as finance reads it (rows of no engine as they are)."""
    return Engine(engine).label if engine in Engine.values else engine
