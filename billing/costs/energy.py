"""Energy and emissions per tenant, model and pool, hour by hour, from the
facts the cost model prices energy with (billing.costs.cost_model): each
GPU piece draws its SKU's busy watts while busy and idle watts while idle,
times its share of the GPU and the hour's PUE (kWh at the wall).

A piece's busy energy goes to the (tenant, model) rows that used its
replica that hour, by device time; its idle energy is its pool's idle row
(no tenant; a spare GPU's, no pool either). Emissions are each piece's
kWh times its node's site's grid intensity that hour (serving.models.
GridIntensity: the hour's own figure, else its year's average; none: no
emissions counted, and the run says which sites lack one).

So the rows of an hour add up to the fleet's energy in that hour: busy
+ idle draw of every piece in service. Stored in micro-kWh and mg of
CO2e (6 and 3 places), each hour's rows rounded together (largest
remainders) to the hour's rounded total. Pure: arrays and frames in."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from metering.apportion import apportion_groups
from serving.choices import IntensityPeriod
from serving.gpu_shares import GPU_UNITS
from serving.models import GridIntensity

HOUR = 3600
MICRO_KWH = 1_000_000  # stored units per kWh
MILLIGRAMS = 1000  # stored units per gram
NONE = -1  # no tenant (idle), no model, no pool (a spare GPU)


@dataclass(frozen=True)
class Draw:
    """Pieces x hours: kWh at the wall while busy and while idle, and the
    grid intensity (g/kWh) where each piece sits."""

    busy_kwh: np.ndarray
    idle_kwh: np.ndarray
    intensity: np.ndarray


def intensities(sites: list[str], hours: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Sites x hours of g/kWh (the hour's figure over its year's average),
    and the sites with no figure at all in the hours (0 there)."""
    out = np.zeros((len(sites), len(hours)))
    if not len(hours):
        return out, []
    first = datetime.fromtimestamp(int(hours[0]), UTC)
    last = datetime.fromtimestamp(int(hours[-1]), UTC)
    index = {site: n for n, site in enumerate(sites)}
    years = np.array([datetime.fromtimestamp(int(h), UTC).year for h in hours])
    rows = GridIntensity.objects.filter(site__in=sites).filter(
        start__gte=datetime(first.year, 1, 1, tzinfo=UTC), start__lte=last
    )
    hourly = []
    for site, period, start, grams in rows.values_list("site", "period", "start", "g_per_kwh"):
        if period == IntensityPeriod.YEAR:
            out[index[site], years == start.year] = float(grams)  # ok-float: g/kWh
        else:
            hourly.append((site, int(start.timestamp()), float(grams)))  # ok-float: g/kWh
    position = {int(h): n for n, h in enumerate(hours)}
    for site, at, grams in hourly:
        if at in position:
            out[index[site], position[at]] = grams
    missing = [site for site in sites if not out[index[site]].any()]
    return out, missing


def draw(
    *,
    placement: pd.DataFrame,
    busy: np.ndarray,
    pue: np.ndarray,
    in_service: np.ndarray,
    intensity: np.ndarray,
) -> Draw:
    """`busy`: pieces x hours busy fraction; `pue`: pieces x hours;
    `intensity`: pieces x hours g/kWh."""
    fraction = (placement["units"].to_numpy(np.float64) / GPU_UNITS)[:, None]
    busy = np.clip(busy, 0.0, 1.0)
    on = in_service.astype(np.float64) * pue * fraction / 1000.0
    busy_w = placement["busy_watts"].to_numpy(np.float64)[:, None]
    idle_w = placement["idle_watts"].to_numpy(np.float64)[:, None]
    return Draw(
        busy_kwh=busy_w * busy * on, idle_kwh=idle_w * (1.0 - busy) * on, intensity=intensity
    )


def energy_rows(
    *, placement: pd.DataFrame, hours: np.ndarray, drawn: Draw, rollups: pd.DataFrame
) -> pd.DataFrame:
    """(hour, pool_id, tenant, model, kwh_micro, co2e_mg): the users' rows
    and each pool's idle row per hour (NONE for no tenant, model or pool)."""
    n_hours = len(hours)
    pieces_pool = placement["pool_id"].fillna(NONE).to_numpy(np.int64)
    replica_of = placement["replica_id"].to_numpy(np.int64)
    parts = []

    # Busy: per replica-hour, split over its users by device time.
    held = replica_of >= 0
    replicas = np.unique(replica_of[held])
    r_index = {r: n for n, r in enumerate(replicas)}
    busy_kwh = np.zeros((len(replicas), n_hours))
    busy_co2 = np.zeros((len(replicas), n_hours))
    for piece in np.flatnonzero(held):
        busy_kwh[r_index[replica_of[piece]]] += drawn.busy_kwh[piece]
        busy_co2[r_index[replica_of[piece]]] += drawn.busy_kwh[piece] * drawn.intensity[piece]
    used = rollups[rollups["replica_id"].isin(r_index)]
    if len(used):
        used = used.groupby(["hour", "replica_id", "pool_id", "tenant", "model"], as_index=False)[
            "device_us"
        ].sum()
        r = used["replica_id"].map(r_index).to_numpy()
        h = (used["hour"].to_numpy() - hours[0]) // HOUR
        device = used["device_us"].to_numpy(np.float64)
        whole = pd.Series(device).groupby([r, h]).transform("sum").to_numpy()
        share = np.divide(device, whole, out=np.zeros_like(device), where=whole > 0)
        parts.append(
            pd.DataFrame(
                {
                    "hour": used["hour"].to_numpy(np.int64),
                    "pool_id": used["pool_id"].to_numpy(np.int64),
                    "tenant": used["tenant"].to_numpy(np.int64),
                    "model": used["model"].to_numpy(np.int64),
                    "kwh": busy_kwh[r, h] * share,
                    "co2": busy_co2[r, h] * share,
                }
            )
        )

    # Idle: per pool-hour (spare GPUs: no pool).
    pools = np.unique(pieces_pool)
    for pool in pools:
        mine = pieces_pool == pool
        parts.append(
            pd.DataFrame(
                {
                    "hour": hours,
                    "pool_id": pool,
                    "tenant": NONE,
                    "model": NONE,
                    "kwh": drawn.idle_kwh[mine].sum(axis=0),
                    "co2": (drawn.idle_kwh[mine] * drawn.intensity[mine]).sum(axis=0),
                }
            )
        )
    rows = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if rows.empty:
        return pd.DataFrame(
            columns=["hour", "pool_id", "tenant", "model", "kwh_micro", "co2e_mg"], dtype=np.int64
        )
    rows = rows[rows["kwh"] > 0]
    group = ((rows["hour"].to_numpy() - hours[0]) // HOUR).astype(np.int64)
    # The fleet's hour, rounded once; the rows rounded to add up to it.
    kwh_total = np.rint((drawn.busy_kwh + drawn.idle_kwh).sum(axis=0) * MICRO_KWH)
    co2_total = np.rint(
        ((drawn.busy_kwh + drawn.idle_kwh) * drawn.intensity).sum(axis=0) * MILLIGRAMS
    )
    return pd.DataFrame(
        {
            "hour": rows["hour"].to_numpy(np.int64),
            "pool_id": rows["pool_id"].to_numpy(np.int64),
            "tenant": rows["tenant"].to_numpy(np.int64),
            "model": rows["model"].to_numpy(np.int64),
            "kwh_micro": apportion_groups(
                rows["kwh"].to_numpy() * MICRO_KWH, group, kwh_total.astype(np.int64)
            ),
            "co2e_mg": apportion_groups(
                rows["co2"].to_numpy() * MILLIGRAMS, group, co2_total.astype(np.int64)
            ),
        }
    )
