"""Who carries each pool-hour's cost (docs/architecture.md, "Cost"). Pure: arrays and
frames in, integer nano-unit rows out, exactly conserved per pool-hour.

Each pool-hour is cut into slices of capacity, each with an owner or none:
- dedicated: one slice owned by the pool's owner (its whole cost, used or not);
- reserved: a slice per holder (its reserved GPU-seconds) plus the rest,
  unowned; a holder's use beyond its slice counts in the rest, as shared use;
- shared: one unowned slice.
In a slice, each use carries the slice's cost x (its device-seconds /
the slice's capacity), by component; the slice's idle rest goes to its
owner (by the owner's use, or on a row with no model), or for an unowned
slice by the idle policy: spread over its users by use, or left unallocated.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from metering.apportion import apportion_groups, group_sum, rounded_totals

COMPONENTS = ("capital", "energy", "other_opex")
NO_OWNER = -1
NO_MODEL = -1
USAGE_TYPES = {"ph": np.int64, "tenant": np.int64, "model": np.int64, "seconds": np.float64}
RESERVATION_TYPES = {"ph": np.int64, "tenant": np.int64, "seconds": np.float64}


@dataclass(frozen=True)
class PoolHours:
    """One entry per pool-hour that has GPUs in service."""

    owner: np.ndarray  # tenant id owning the whole pool (dedicated) or NO_OWNER
    reserved: np.ndarray  # bool: a reserved pool
    spread_idle: np.ndarray  # bool: unowned idle spread over users (else platform's)
    capacity_seconds: np.ndarray  # float: GPUs x 3600
    capital: np.ndarray  # int64 nano
    energy: np.ndarray
    other_opex: np.ndarray

    def __len__(self) -> int:
        return len(self.owner)

    def cost(self, component: str) -> np.ndarray:
        return getattr(self, component)

    @property
    def total(self) -> np.ndarray:
        return self.capital + self.energy + self.other_opex


def allocate(
    pool_hours: PoolHours, usage: pd.DataFrame, reservations: pd.DataFrame
) -> pd.DataFrame:
    """`usage`: one row per (ph, tenant, model) with `seconds` (float) of
    device time; `reservations`: (ph, tenant, seconds) reserved GPU-seconds.
    Returns (ph, tenant, model, capital, energy, other_opex, idle) int64."""
    usage = usage.astype(USAGE_TYPES)[list(USAGE_TYPES)]
    reservations = reservations.astype(RESERVATION_TYPES)[list(RESERVATION_TYPES)]
    slices = _slices(pool_hours, reservations)
    entries = _entries(pool_hours, slices, usage)
    n_slices = len(slices)
    slice_cost = {c: _split_cost(pool_hours, slices, c) for c in COMPONENTS}

    sl = entries["slice"].to_numpy()
    capacity = slices["capacity"].to_numpy()
    used = np.bincount(sl, weights=entries["x"].to_numpy(), minlength=n_slices)
    scale = np.where(used > capacity, capacity / np.maximum(used, 1e-300), 1.0)
    share = entries["x"].to_numpy() * scale[sl] / np.maximum(capacity[sl], 1e-300)
    busy_total = np.zeros(n_slices, dtype=np.int64)
    for c in COMPONENTS:
        values = slice_cost[c][sl] * share
        target = rounded_totals(values, sl, n_slices, cap=slice_cost[c])
        entries[c] = apportion_groups(values, sl, target)
        busy_total += target
    idle = sum(slice_cost[c] for c in COMPONENTS) - busy_total

    owner = slices["owner"].to_numpy()
    spread = pool_hours.spread_idle[slices["ph"].to_numpy()]
    tenant = entries["tenant"].to_numpy()
    weight = np.where(
        owner[sl] != NO_OWNER,
        entries["x"].to_numpy() * (tenant == owner[sl]),
        np.where(spread[sl], entries["x"].to_numpy(), 0.0),
    )
    weight_total = np.bincount(sl, weights=weight, minlength=n_slices)

    # An owner that used nothing still carries its slice's idle cost.
    unused = np.flatnonzero((owner != NO_OWNER) & (weight_total <= 0) & (idle > 0))
    if len(unused):
        extra = pd.DataFrame(
            {
                "slice": unused,
                "ph": slices["ph"].to_numpy()[unused],
                "tenant": owner[unused],
                "model": NO_MODEL,
                "x": 0.0,
                **{c: np.zeros(len(unused), dtype=np.int64) for c in COMPONENTS},
            }
        )
        entries = pd.concat([entries, extra], ignore_index=True)
        weight = np.concatenate([weight, np.ones(len(unused))])
        weight_total[unused] = 1.0
        sl = entries["slice"].to_numpy()

    goes = weight_total > 0
    idle_target = np.where(goes, idle, 0)
    entries["idle"] = apportion_groups(
        idle_target[sl] * weight / np.where(goes, weight_total, 1.0)[sl], sl, idle_target
    )

    rows = entries.groupby(["ph", "tenant", "model"], as_index=False, sort=True)[
        [*COMPONENTS, "idle"]
    ].sum()
    return rows


def pool_hour_allocated(pool_hours: PoolHours, rows: pd.DataFrame) -> np.ndarray:
    """Per pool-hour, the nano-units allocated to tenants."""
    total = rows[list(COMPONENTS)].sum(axis=1).to_numpy() + rows["idle"].to_numpy()
    return group_sum(total.astype(np.int64), rows["ph"].to_numpy(), len(pool_hours))


def _slices(pool_hours: PoolHours, reservations: pd.DataFrame) -> pd.DataFrame:
    """(ph, owner, capacity seconds) of every slice."""
    n = len(pool_hours)
    whole = np.flatnonzero(~pool_hours.reserved)
    parts = [
        pd.DataFrame(
            {
                "ph": whole,
                "owner": pool_hours.owner[whole],
                "capacity": pool_hours.capacity_seconds[whole],
            }
        )
    ]
    held = reservations[pool_hours.reserved[reservations["ph"].to_numpy()]]
    held = held.groupby(["ph", "tenant"], as_index=False)["seconds"].sum()
    reserved_total = np.bincount(held["ph"], weights=held["seconds"], minlength=n)
    # More reserved than the pool holds: each holder's slice shrinks pro rata.
    fit = np.where(
        reserved_total > pool_hours.capacity_seconds,
        pool_hours.capacity_seconds / np.maximum(reserved_total, 1e-300),
        1.0,
    )
    held_capacity = held["seconds"].to_numpy() * fit[held["ph"].to_numpy()]
    parts.append(
        pd.DataFrame({"ph": held["ph"], "owner": held["tenant"], "capacity": held_capacity})
    )
    rest = pool_hours.capacity_seconds - np.minimum(reserved_total, pool_hours.capacity_seconds)
    open_ = np.flatnonzero(pool_hours.reserved & (rest > 1e-6))
    parts.append(pd.DataFrame({"ph": open_, "owner": NO_OWNER, "capacity": rest[open_]}))
    slices = pd.concat(parts, ignore_index=True)
    slices["owner"] = slices["owner"].astype(np.int64)
    return slices


def _split_cost(pool_hours: PoolHours, slices: pd.DataFrame, component: str) -> np.ndarray:
    """A pool-hour's cost of one component, split over its slices by capacity."""
    ph = slices["ph"].to_numpy()
    cost = pool_hours.cost(component)
    values = cost[ph] * slices["capacity"].to_numpy() / pool_hours.capacity_seconds[ph]
    return apportion_groups(values, ph, cost)


def _entries(pool_hours: PoolHours, slices: pd.DataFrame, usage: pd.DataFrame) -> pd.DataFrame:
    """Each use placed in the slice(s) it ran in, as `x` device-seconds."""
    slices = slices.assign(slice=np.arange(len(slices)))
    reserved = pool_hours.reserved[usage["ph"].to_numpy()]

    plain = usage[~reserved].merge(slices[["ph", "slice", "owner"]], on="ph")
    # A dedicated pool's cost is its owner's alone: other use carries none.
    owned = plain["owner"].to_numpy() != NO_OWNER
    plain["x"] = np.where(owned & (plain["tenant"] != plain["owner"]), 0.0, plain["seconds"])

    in_reserved = usage[reserved]
    holder = slices[slices["owner"] != NO_OWNER][["ph", "owner", "slice", "capacity"]]
    holder = holder.rename(columns={"owner": "tenant"})
    rest = slices[(slices["owner"] == NO_OWNER)][["ph", "slice"]]
    rest = rest[pool_hours.reserved[rest["ph"].to_numpy()]]
    mine = in_reserved.merge(holder, on=["ph", "tenant"], how="left")
    used = mine.groupby(["ph", "tenant"])["seconds"].transform("sum").to_numpy()
    capacity = mine["capacity"].fillna(0.0).to_numpy()
    inside = np.where(used > 0, np.minimum(1.0, capacity / np.maximum(used, 1e-300)), 0.0)
    within = mine[mine["slice"].notna()].assign(x=(mine["seconds"] * inside)[mine["slice"].notna()])
    beyond = mine.assign(x=mine["seconds"] * (1.0 - inside)).drop(columns=["slice"])
    beyond = beyond.merge(rest, on="ph")  # no unreserved capacity: nothing more to carry

    columns = ["slice", "ph", "tenant", "model", "x"]
    entries = pd.concat([plain[columns], within[columns], beyond[columns]], ignore_index=True)
    entries["slice"] = entries["slice"].astype(np.int64)
    return entries
