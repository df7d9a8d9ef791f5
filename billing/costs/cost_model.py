"""What each GPU cost in each hour (docs/architecture.md, "Cost"), vectorised over
GPUs x hours. Pure: inputs are arrays, outputs are int64 nano-units.

Capital is exact integer arithmetic: straight-line depreciation spreads
(capex - salvage) over the life's hours so that the hours of a whole life
add up to it exactly, and stops at the end of life. Energy and overheads
are physical quantities times rates, rounded once per GPU-hour to 1e-9."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from serving.gpu_shares import GPU_UNITS

HOUR = 3600


@dataclass(frozen=True)
class FleetArrays:
    """One entry per piece of a GPU (a whole GPU is one piece; a
    MIG-partitioned or time-sliced one, several: billing.costs.inputs).
    Times are UTC epoch seconds, hour-aligned; the cost facts are the whole
    GPU's. Without `gpu`, `units` and `last`, every entry is a whole GPU."""

    scope: np.ndarray  # int: index of the rate scope (the piece's pool)
    in_service: np.ndarray  # int: first hour the GPU costs anything
    life_hours: np.ndarray  # int: depreciation hours (0 for a leased GPU)
    depreciable_nano: np.ndarray  # int: capex - salvage (0 for a leased GPU)
    lease_nano_per_hour: np.ndarray  # int: 0 for an owned GPU
    idle_watts: np.ndarray
    busy_watts: np.ndarray
    gpu: np.ndarray | None = None  # int: which GPU (0..n-1) the piece is of
    units: np.ndarray | None = None  # int: the piece's GPU units (of GPU_UNITS)
    last: np.ndarray | None = None  # bool: its GPU's last piece


@dataclass(frozen=True)
class RateArrays:
    """One row per rate scope, one column per hour (see billing.costs.rates)."""

    tariff_nano_per_kwh: np.ndarray
    pue: np.ndarray
    nano_per_gpu_hour: np.ndarray
    nano_per_kw_hour: np.ndarray


@dataclass(frozen=True)
class GpuHourCosts:
    """GPUs x hours, int64 nano-units, and which GPU-hours count at all."""

    capital: np.ndarray
    energy: np.ndarray
    other_opex: np.ndarray
    in_service: np.ndarray  # bool
    fully_depreciated: np.ndarray  # bool: owned, in service, past its life


def gpu_hour_costs(
    *, fleet: FleetArrays, rates: RateArrays, hours: np.ndarray, busy_fraction: np.ndarray
) -> GpuHourCosts:
    """`hours`: epoch seconds of each hour's start; `busy_fraction`: pieces
    x hours in [0, 1], the share of the hour attribution found the piece
    busy. A piece costs its GPU's cost x units / GPU_UNITS: capital split
    exactly (its GPU's last piece takes the remainder), energy and other
    opex rounded per piece-hour."""
    age = (hours[None, :] - fleet.in_service[:, None]) // HOUR  # hours since in service
    in_service = age >= 0
    owned = fleet.life_hours > 0
    in_life = in_service & (age < fleet.life_hours[:, None]) & owned[:, None]

    capital = np.where(in_life, _depreciation(fleet, age), 0)
    leased = in_service & ~owned[:, None]
    capital = np.where(leased, fleet.lease_nano_per_hour[:, None], capital)

    capital = capital.astype(np.int64)
    fraction = 1.0
    if fleet.units is not None and len(fleet.units):
        capital = _capital_split(capital, fleet)
        fraction = (fleet.units / GPU_UNITS)[:, None]

    busy = np.clip(busy_fraction, 0.0, 1.0)
    idle_w = fleet.idle_watts[:, None].astype(np.float64)
    kwh = (idle_w + (fleet.busy_watts[:, None] - idle_w) * busy) / 1000.0 * fraction
    scope = fleet.scope
    energy = np.rint(kwh * rates.pue[scope] * rates.tariff_nano_per_kwh[scope])
    busy_kw = fleet.busy_watts[:, None] / 1000.0
    other = np.rint(
        (rates.nano_per_gpu_hour[scope] + rates.nano_per_kw_hour[scope] * busy_kw) * fraction
    )

    zero = np.int64(0)
    return GpuHourCosts(
        capital=capital,
        energy=np.where(in_service, energy, zero).astype(np.int64),
        other_opex=np.where(in_service, other, zero).astype(np.int64),
        in_service=in_service,
        fully_depreciated=in_service & owned[:, None] & ~in_life,
    )


def _capital_split(capital: np.ndarray, fleet: FleetArrays) -> np.ndarray:
    """Each piece's part of its GPU's capital (`capital`: the whole GPU's,
    per piece): units / GPU_UNITS of it rounded down, and the GPU's last
    piece what is left, so a GPU's pieces add up to it exactly."""
    share = capital * fleet.units[:, None] // GPU_UNITS
    others = np.zeros((int(fleet.gpu.max()) + 1, capital.shape[1]), dtype=np.int64)
    np.add.at(others, fleet.gpu[~fleet.last], share[~fleet.last])
    share[fleet.last] = capital[fleet.last] - others[fleet.gpu[fleet.last]]
    return share


def _depreciation(fleet: FleetArrays, age: np.ndarray) -> np.ndarray:
    """Hour k of a life of L hours gets floor(D(k+1)/L) - floor(Dk/L): every
    hour within one nano-unit of D/L, and the life sums to D exactly. Split
    as D = qL + r so the products stay far inside int64."""
    life = np.maximum(fleet.life_hours, 1)[:, None]
    quotient = (fleet.depreciable_nano // np.maximum(fleet.life_hours, 1))[:, None]
    remainder = (fleet.depreciable_nano % np.maximum(fleet.life_hours, 1))[:, None]
    k = np.clip(age, 0, None)
    return quotient + (remainder * (k + 1)) // life - (remainder * k) // life
