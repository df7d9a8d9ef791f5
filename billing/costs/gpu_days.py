"""Each GPU's own cost per UTC day, by component: the allocation's cost
model (the same book of rates, fleet and usage a run reads) kept per GPU
instead of summed per pool-hour. Summed over a pool's GPUs, a day's cost
is the pool-hours' booked cost, as long as nothing the run read has
changed since: the fleet is read as it stands (a GPU moved to another
pool is costed in its new pool for the days before too, as a run booking
those days again would). For the fleet's FOCUS export
(billing.reports.focus_fleet).

UTC days, the first and last cut to the hours `start` and `end` fall in
(a row is that part of its day); computed up to 31 days at a time, cut at
midnight so that no day is split between two, and a long range never
holds more than a month of (GPUs x hours) arrays."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from billing.costs.allocation import COMPONENTS
from billing.costs.period import allocation_book, stretch_gpu_costs
from core.nanos import from_nano
from metering.selectors.totals import usage_device_frame
from serving.models import Gpu

DAY = 86_400
STRETCH = timedelta(days=31)


@dataclass(frozen=True)
class GpuDay:
    start: datetime  # the day's midnight, or the range's start on its first day
    end: datetime
    gpu_id: int
    serial: str
    pool_id: int | None
    hours: int  # in service that day
    costs: dict  # component -> Decimal


def gpu_day_costs(*, start: datetime, end: datetime) -> Iterator[GpuDay]:
    hour = {"minute": 0, "second": 0, "microsecond": 0}
    since = start.astimezone(UTC).replace(**hour)
    end = end.astimezone(UTC).replace(**hour)
    while since < end:
        midnight = since.replace(hour=0)
        until = min(midnight + STRETCH, end)
        yield from _stretch(since, until)
        since = until


def _stretch(start: datetime, end: datetime) -> Iterator[GpuDay]:
    book = allocation_book(start=start, end=end)
    if not len(book.hours) or book.placement.empty:
        return
    serials = dict(Gpu.objects.values_list("pk", "serial"))  # as the book read the fleet
    costs = stretch_gpu_costs(book, 0, len(book.hours), usage_device_frame(start=start, end=end))
    days, day_of_hour = np.unique(book.hours // DAY, return_inverse=True)
    # (GPUs x days) sums of each (GPUs x hours) array.
    per_day = {
        name: np.stack(
            [getattr(costs, name)[:, day_of_hour == d].sum(axis=1) for d in range(len(days))],
            axis=1,
        )
        for name in (*COMPONENTS, "in_service")
    }
    # A GPU in pieces (MIG instances, time slices) is one row per pool it is in.
    pieces = np.stack(
        [
            book.placement["gpu_id"].to_numpy(np.int64),
            book.placement["pool_id"].fillna(-1).to_numpy(np.int64),
        ],
        axis=1,
    )
    keys, group = np.unique(pieces, axis=0, return_inverse=True)
    group = group.reshape(-1)
    for name, values in list(per_day.items()):
        summed = np.zeros((len(keys), values.shape[1]), dtype=values.dtype)
        # Hours in service are the GPU's, whatever its pieces; costs add up.
        (np.maximum if name == "in_service" else np.add).at(summed, group, values)
        per_day[name] = summed
    gpu_ids, pool_ids = keys[:, 0], keys[:, 1]
    for d, g in zip(*np.nonzero(per_day["in_service"].T), strict=True):  # by day, then GPU
        pool = pool_ids[g]
        midnight = datetime.fromtimestamp(int(days[d]) * DAY, tz=UTC)
        yield GpuDay(
            start=max(midnight, start),
            end=min(midnight + timedelta(days=1), end),
            gpu_id=int(gpu_ids[g]),
            serial=serials[int(gpu_ids[g])],
            pool_id=None if pool < 0 else int(pool),
            hours=int(per_day["in_service"][g, d]),
            costs={c: from_nano(int(per_day[c][g, d])) for c in COMPONENTS},
        )
