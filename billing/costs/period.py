"""A period's allocation, computed without writing anything: what is read
once per run (the fleet, pools, rates, reservations: an AllocationBook) and
the vectorised computation of any stretch of its hours from that stretch's
usage rollups (allocation_stretch), which is pure and runs in a thread
while the previous stretch is written.

Currency. Cost is booked in the reporting currency. A GPU priced, or a
rate entered, in another currency is costed in its own currency first (the
cost model is linear in money: one pass per currency, each with only that
currency's facts) and converted at the rate of each hour's UTC day, the
same dated rates revenue is converted at (billing.fx: stored,
inverse or cross; none within a week before: the run fails naming the pair
and the day). Each pool-hour keeps, beside its converted cost, what of it
was in each other currency and the rate used."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from datetime import UTC, datetime
from decimal import Decimal

import numpy as np
import pandas as pd

from billing.costs.allocation import COMPONENTS, NO_OWNER, PoolHours, allocate, pool_hour_allocated
from billing.costs.cost_model import (
    HOUR,
    FleetArrays,
    GpuHourCosts,
    RateArrays,
    gpu_hour_costs,
)
from billing.costs.energy import draw, energy_rows, intensities
from billing.costs.inputs import (
    fleet_arrays,
    fleet_placement,
    pool_usage,
    pools_by_id,
    replica_busy_seconds,
    reservation_seconds,
    reservations_overlapping,
)
from billing.costs.rates import RateScope, rate_arrays, rates_in_force
from billing.fx import FxTable, reporting_currency
from billing.models import CostScenario
from core.nanos import from_nano
from metering.selectors.totals import usage_device_frame
from serving.choices import IdleCostPolicy, PoolKind
from serving.gpu_shares import GPU_UNITS
from serving.models import Pool


@dataclass(frozen=True)
class CurrencyPass:
    """The cost facts entered in one currency (the others zero), and the
    rate of each hour of the book into the book's currency (None: it is
    the book's currency)."""

    currency: str
    fleet: FleetArrays
    rates: RateArrays
    fx: np.ndarray | None = None  # float per hour
    fx_text: list[str] | None = None  # the same rates as stored, per hour


@dataclass(frozen=True)
class AllocationBook:
    """Everything a run reads once: its hours, the fleet and where each GPU
    sits, the pools, the rates resolved per scope and hour (a pass per
    currency they are in), reservations, and the currency it books in."""

    hours: np.ndarray
    pools: dict[int, Pool]
    placement: pd.DataFrame
    scopes: list[RateScope]
    gpu_scope: np.ndarray
    passes: list[CurrencyPass]
    currency: str
    warnings: list[str]
    idle_policy: str | None
    reservations: pd.DataFrame
    intensity: np.ndarray  # pieces x hours: g CO2e per kWh where each sits (booked only)
    booked: bool = True  # the booked book (no scenario): the one whose energy is kept

    @property
    def fleet(self) -> FleetArrays:
        """The whole fleet (every currency's facts): for what is not money."""
        return self.passes[0].fleet


def allocation_book(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None
) -> AllocationBook:
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
    currency = reporting_currency()
    rates, warnings = rate_arrays(
        rates=rates_in_force(start=start, end=end, scenario=scenario),
        scopes=scopes,
        hours=hours,
        currencies={currency, *placement["currency"]},
    )
    passes = [_pass(c, placement, gpu_scope, rates, hours, book=currency) for c in sorted(rates)]
    intensity = np.zeros((len(placement), len(hours)))
    if scenario is None:  # a scenario prices the fleet's energy; it does not use it
        sites = sorted(set(placement["site"]))
        by_site, unknown = intensities(sites, hours)
        if len(placement):
            site_of = {site: n for n, site in enumerate(sites)}
            intensity = by_site[[site_of[site] for site in placement["site"]]]
        if unknown:
            names = ", ".join(repr(site) for site in unknown)
            warnings = [*warnings, f"no grid intensity (no emissions counted) at: {names}"]
    return AllocationBook(
        hours=hours,
        pools=pools,
        placement=placement,
        scopes=scopes,
        gpu_scope=gpu_scope,
        # The book's own currency first (and alone, as a rule): its fleet is
        # the one `fleet` gives.
        passes=sorted(passes, key=lambda p: p.fx is not None),
        currency=currency,
        warnings=warnings,
        idle_policy=scenario.idle_cost_policy if scenario and scenario.idle_cost_policy else None,
        reservations=reservations_overlapping(start=start, end=end),
        intensity=intensity,
        booked=scenario is None,
    )


def _pass(
    currency: str,
    placement: pd.DataFrame,
    gpu_scope: np.ndarray,
    rates: dict[str, RateArrays],
    hours: np.ndarray,
    *,
    book: str,
) -> CurrencyPass:
    """Currency `currency`'s facts; for another than `book`, the rates of
    each hour's day into it (FxRateMissingError naming a missing one)."""
    alone = set(placement["currency"]) <= {book} and set(rates) == {book}
    fleet = fleet_arrays(placement, scope=gpu_scope, currency=None if alone else currency)
    if currency == book:
        return CurrencyPass(currency, fleet, rates[currency])
    day_of = [datetime.fromtimestamp(int(h), UTC).date() for h in hours]
    rate: list[Decimal] = []
    if day_of:
        table = FxTable.load(currencies={currency, book}, first=day_of[0], last=day_of[-1])
        by_day = {d: table.day_rate(base=currency, quote=book, day=d)[0] for d in set(day_of)}
        rate = [by_day[d] for d in day_of]
    return CurrencyPass(
        currency,
        fleet,
        rates[currency],
        fx=np.array([float(r) for r in rate]),  # ok-float: each GPU-hour rounded once to 1e-9
        fx_text=[f"{r.normalize():f}" for r in rate],
    )


def allocation_compute(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None
) -> AllocationResult:
    """A whole period, computed without writing anything."""
    book = allocation_book(start=start, end=end, scenario=scenario)
    return allocation_stretch(book, 0, len(book.hours), usage_device_frame(start=start, end=end))


class AllocationResult:
    """A period's pool-hour costs and allocation rows, ready to write."""

    def __init__(self, hours, pool_hours: pd.DataFrame, rows: pd.DataFrame, warnings, energy=None):
        self.hours = hours
        self.pool_hours = pool_hours
        self.rows = rows
        self.warnings = warnings
        self.energy = energy  # billing.costs.energy.energy_rows


def stretch_gpu_costs(
    book: AllocationBook, first: int, stop: int, rollups: pd.DataFrame
) -> GpuHourCosts:
    """Each GPU's cost in hours [first, stop) of the book (GPUs x hours,
    nano-units of the book's currency): what allocation sums per pool-hour."""
    return _stretch_costs(book, first, stop, rollups)[0]


def _stretch_costs(
    book: AllocationBook, first: int, stop: int, rollups: pd.DataFrame
) -> tuple[GpuHourCosts, dict[str, np.ndarray], np.ndarray]:
    """The stretch's GPU costs in the book's currency, for each other
    currency the part of them entered in it (GPUs x hours, nano-units of
    that currency, the three components together), and each piece's busy
    fraction (pieces x hours)."""
    hours = book.hours[first:stop]
    busy = _busy_fraction(book.placement, hours, replica_busy_seconds(rollups))
    total: GpuHourCosts | None = None
    foreign: dict[str, np.ndarray] = {}
    for cost_pass in book.passes:
        rates = RateArrays(
            **{f.name: getattr(cost_pass.rates, f.name)[:, first:stop] for f in fields(RateArrays)}
        )
        costs = gpu_hour_costs(fleet=cost_pass.fleet, rates=rates, hours=hours, busy_fraction=busy)
        if cost_pass.fx is not None:
            foreign[cost_pass.currency] = costs.capital + costs.energy + costs.other_opex
            fx = cost_pass.fx[None, first:stop]
            costs = replace(
                costs, **{c: np.rint(getattr(costs, c) * fx).astype(np.int64) for c in COMPONENTS}
            )
        total = costs if total is None else _costs_add(total, costs)
    return total, foreign, busy


def _costs_add(a: GpuHourCosts, b: GpuHourCosts) -> GpuHourCosts:
    return replace(a, **{c: getattr(a, c) + getattr(b, c) for c in COMPONENTS})


def allocation_stretch(
    book: AllocationBook, first: int, stop: int, rollups: pd.DataFrame
) -> AllocationResult:
    """Hours [first, stop) of the book, from those hours' usage rollups."""
    hours = book.hours[first:stop]
    pools, scopes, gpu_scope = book.pools, book.scopes, book.gpu_scope
    costs, foreign, busy = _stretch_costs(book, first, stop, rollups)

    # Pool-hours: (scope x hour) sums over the GPU pieces in each scope; a
    # GPU counts once in each scope it has pieces in, its capacity by units.
    n_scopes = len(scopes)
    per_scope = {name: _scope_sum(getattr(costs, name), gpu_scope, n_scopes) for name in COMPONENTS}
    counted = ~book.placement.duplicated(["gpu_id", "pool_id"]).to_numpy()
    for name in ("in_service", "fully_depreciated"):
        per_scope[name] = _scope_sum(getattr(costs, name) & counted[:, None], gpu_scope, n_scopes)
    units = book.placement["units"].to_numpy(np.int64)[:, None]
    capacity_units = _scope_sum(costs.in_service * units, gpu_scope, n_scopes)
    cell_scope, cell_hour = np.nonzero(per_scope["in_service"] > 0)
    pool_ids = np.array([scopes[s].pool_id or 0 for s in cell_scope], dtype=np.int64)
    kinds = [pools[p].kind if p else "" for p in pool_ids]
    policy = book.idle_policy
    spread = np.array(
        [
            bool(p) and (policy or pools[p].idle_cost_policy) == IdleCostPolicy.SPREAD
            for p in pool_ids
        ],
        dtype=bool,
    )
    gpus = per_scope["in_service"][cell_scope, cell_hour]
    capacity_seconds = capacity_units[cell_scope, cell_hour] * (HOUR / GPU_UNITS)
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
        capacity_seconds=capacity_seconds,
        **{c: per_scope[c][cell_scope, cell_hour] for c in COMPONENTS},
    )
    # Spare GPUs (scope 0) are never anybody's: their pool-hours take no use.
    index = pd.DataFrame({"ph": np.arange(len(ph)), "pool_id": pool_ids, "hour": hours[cell_hour]})
    index = index[index["pool_id"] != 0]
    usage = pool_usage(rollups).merge(index, on=["hour", "pool_id"])
    held = reservation_seconds(book.reservations, hours=hours).merge(index, on=["hour", "pool_id"])
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
            "capacity_us": capacity_units[cell_scope, cell_hour] * (HOUR * 1_000_000) // GPU_UNITS,
            "busy_us": busy_us,
            **{c: per_scope[c][cell_scope, cell_hour] for c in COMPONENTS},
            "total": total,
            "allocated": allocated,
            "unallocated": total - allocated,
            "currency": book.currency,
            "original": _originals(book, foreign, gpu_scope, cell_scope, cell_hour, first),
        }
    )
    if not book.booked:
        return AllocationResult(hours, pool_hours, rows, book.warnings)
    drawn = draw(
        placement=book.placement,
        busy=busy,
        pue=book.passes[0].rates.pue[gpu_scope][:, first:stop],
        in_service=costs.in_service,
        intensity=book.intensity[:, first:stop],
    )
    energy = energy_rows(placement=book.placement, hours=hours, drawn=drawn, rollups=rollups)
    return AllocationResult(hours, pool_hours, rows, book.warnings, energy)


def _originals(book, foreign, gpu_scope, cell_scope, cell_hour, first: int) -> list[str]:
    """Per pool-hour, as JSON: what of its cost was entered in each other
    currency, in that currency, and the rate it was converted at
    ({"EUR": {"amount": "12.5", "rate": "1.0956"}}; {} when none was)."""
    if not foreign:
        return ["{}"] * len(cell_scope)
    texts: dict[str, list[str]] = {}
    amounts: dict[str, np.ndarray] = {}
    for cost_pass in book.passes:
        if cost_pass.currency in foreign:
            per_scope = _scope_sum(foreign[cost_pass.currency], gpu_scope, len(book.scopes))
            amounts[cost_pass.currency] = per_scope[cell_scope, cell_hour]
            texts[cost_pass.currency] = cost_pass.fx_text[first:]
    out = []
    for i, hour in enumerate(cell_hour):
        entry = {
            currency: {"amount": f"{from_nano(int(nano[i])):f}", "rate": texts[currency][hour]}
            for currency, nano in amounts.items()
            if nano[i]
        }
        out.append(json.dumps(entry, sort_keys=True))
    return out


def _busy_fraction(placement: pd.DataFrame, hours: np.ndarray, seconds: pd.DataFrame) -> np.ndarray:
    """Pieces x hours: the busy share of the replica holding each piece
    (its busy device-seconds over its capacity, all its GPU units x the
    hour); 0 for a piece no replica holds."""
    busy = np.zeros((len(placement), len(hours)))
    replica_ids = placement["replica_id"].to_numpy()
    held = replica_ids >= 0
    if not held.any():
        return busy
    units = pd.Series(placement["units"].to_numpy()[held]).groupby(replica_ids[held]).sum()
    seconds = seconds[seconds["replica_id"].isin(units.index)]
    replica_index = {r: i for i, r in enumerate(units.index)}
    per_replica = np.zeros((len(replica_index), len(hours)))
    rows = seconds["replica_id"].map(replica_index).to_numpy()
    cols = (seconds["hour"].to_numpy() - hours[0]) // HOUR
    per_replica[rows, cols] = seconds["seconds"].to_numpy() / (
        units.loc[seconds["replica_id"]].to_numpy() * (HOUR / GPU_UNITS)
    )
    busy[held] = per_replica[[replica_index[r] for r in replica_ids[held]]]
    return busy


def _scope_sum(values: np.ndarray, scope: np.ndarray, n_scopes: int) -> np.ndarray:
    out = np.zeros((n_scopes, values.shape[1]), dtype=np.int64)
    for s in np.unique(scope):
        out[s] = values[scope == s].sum(axis=0, dtype=np.int64)
    return out
