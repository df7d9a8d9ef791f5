"""Writing an allocation's results, a day at a time, each day replaced in
one transaction. Rows go through COPY as CSV that Arrow's C++ writer
formats from the integers the computation holds (nano-units, microseconds,
epoch seconds): exact decimal text, and no Python object per row."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pa_csv
from django.db import connection, transaction

from billing.models import CostAllocation, PoolHourCost
from metering.energy import energy_day_replace, energy_hours_clear

HOUR = 3600
POOL_HOUR_MONEY = ("capital", "energy", "other_opex", "total", "allocated", "unallocated")


def decimal_text(values: pd.Series, places: int) -> pa.Array:
    """Non-negative integers of 10^-places units as exact decimal strings."""
    digits = pc.utf8_lpad(pc.cast(pa.array(values, pa.int64()), pa.string()), places + 1, "0")
    return pc.binary_join_element_wise(
        pc.utf8_slice_codeunits(digits, 0, -places),
        pc.utf8_slice_codeunits(digits, -places),
        ".",
    )


def _hours(values: pd.Series) -> pa.Array:
    return pa.array(values, pa.int64()).cast(pa.timestamp("s", tz="UTC"))


def _ids(values: pd.Series, *, missing: int) -> pa.Array:
    """Ids with `missing` (0 or -1) written as NULL."""
    return pa.array(values, pa.int64(), mask=(values == missing).to_numpy())


def pool_hour_table(frame: pd.DataFrame, *, scenario_id: int | None) -> pa.Table:
    columns = {
        "scenario_id": pa.array([scenario_id] * len(frame), pa.int64()),
        "hour": _hours(frame["hour"]),
        "pool_id": _ids(frame["pool_id"], missing=0),
        "pool_kind": pa.array(frame["pool_kind"], pa.string()),
        "gpus": pa.array(frame["gpus"], pa.int64()),
        "fully_depreciated_gpus": pa.array(frame["fully_depreciated_gpus"], pa.int64()),
        "capacity_seconds": decimal_text(frame["capacity_us"], 6),
        "busy_seconds": decimal_text(frame["busy_us"], 6),
    }
    columns |= {c: decimal_text(frame[c], 9) for c in POOL_HOUR_MONEY}
    columns["currency"] = pa.array(frame["currency"], pa.string())
    columns["original"] = pa.array(frame["original"], pa.string())
    return pa.table(columns)


def allocation_table(frame: pd.DataFrame, *, scenario_id: int | None) -> pa.Table:
    total = frame["capital"] + frame["energy"] + frame["other_opex"] + frame["idle"]
    columns = {
        "scenario_id": pa.array([scenario_id] * len(frame), pa.int64()),
        "hour": _hours(frame["hour"]),
        "tenant_id": pa.array(frame["tenant"], pa.int64()),
        "pool_id": pa.array(frame["pool_id"], pa.int64()),
        "pool_kind": pa.array(frame["pool_kind"], pa.string()),
        "served_model_id": _ids(frame["model"], missing=-1),
        "device_seconds": decimal_text(frame["device_us"], 6),
        **{c: decimal_text(frame[c], 9) for c in ("capital", "energy", "other_opex", "idle")},
        "total": decimal_text(total, 9),
    }
    return pa.table(columns)


@dataclass(frozen=True)
class DayRows:
    """One day of a book, ready to COPY: its pool-hours' and its rows' CSV
    (formatted where it was computed, off the thread that writes)."""

    first_hour: int  # epoch seconds
    last_hour: int
    pool_hours_csv: bytes
    rows_csv: bytes
    columns: tuple[tuple[str, ...], tuple[str, ...]]
    energy_csv: bytes | None = None  # metering.energy.COLUMNS; the booked book's only


def energy_table(frame: pd.DataFrame) -> pa.Table:
    """billing.costs.energy.energy_rows as metering.energy.COLUMNS."""
    return pa.table(
        {
            "hour": _hours(frame["hour"]),
            "pool_id": _ids(frame["pool_id"], missing=-1),
            "tenant_id": _ids(frame["tenant"], missing=-1),
            "served_model_id": _ids(frame["model"], missing=-1),
            "kwh": decimal_text(frame["kwh_micro"], 6),
            "co2e_g": decimal_text(frame["co2e_mg"], 3),
        }
    )


def allocation_days(
    pool_hours: pa.Table, rows: pa.Table, *, hours: Sequence[int], energy: pa.Table | None = None
) -> list[DayRows]:
    """`hours` (epoch seconds, a whole number of days but the last) cut
    into days, each day's rows of the two tables (and the energy hours,
    when given) as CSV."""
    days = []
    for first in range(0, len(hours), 24):
        first_hour, last_hour = int(hours[first]), int(hours[min(first + 24, len(hours)) - 1])
        start = pa.scalar(datetime.fromtimestamp(first_hour, UTC))
        end = pa.scalar(datetime.fromtimestamp(last_hour + HOUR, UTC))
        csvs = []
        for table in (pool_hours, rows, energy):
            if table is None:
                csvs.append(None)
                continue
            hour = table["hour"]
            day = table.filter(pc.and_(pc.greater_equal(hour, start), pc.less(hour, end)))
            csvs.append(_csv(day))
        days.append(
            DayRows(
                first_hour,
                last_hour,
                csvs[0],
                csvs[1],
                columns=(tuple(pool_hours.column_names), tuple(rows.column_names)),
                energy_csv=csvs[2],
            )
        )
    return days


def allocation_hours_held(*, scenario_id: int | None, start: datetime, end: datetime) -> set[int]:
    """The hours (epoch seconds) of [start, end) for which the book already
    holds rows in either table: only their days have rows to delete before
    they are written again. (A DELETE of a day that holds none still reads
    every row written since the hour index's BRIN ranges were summarized:
    on a first run, each day re-read all the days before it.)"""
    book = {"scenario_id": scenario_id, "hour__gte": start, "hour__lt": end}
    held = set()
    for model in (PoolHourCost, CostAllocation):
        held.update(model.objects.filter(**book).values_list("hour", flat=True).distinct())
    return {int(hour.timestamp()) for hour in held}


def allocation_hours_clear(*, scenario_id: int | None, after: datetime) -> None:
    """Delete the book's rows (the booked book's energy hours too) at and
    after `after`, all or nothing: hours that had not happened when a run
    booked them."""
    book = {"scenario_id": scenario_id, "hour__gte": after}
    with transaction.atomic():
        PoolHourCost.objects.filter(**book).delete()
        CostAllocation.objects.filter(**book).delete()
        if scenario_id is None:
            energy_hours_clear(after=after)


def allocation_day_replace(
    *,
    scenario_id: int | None,
    day: DayRows,
    replace: bool = True,
    then: Callable[[], object] = lambda: None,
) -> None:
    """Replace one day of a book (booked: scenario None) with `day`'s rows,
    all or nothing; `then` runs in the same transaction (the run's
    progress). `replace` False: the book holds nothing that day (the caller
    checked, holding the book's lock), so nothing is deleted first."""
    start = datetime.fromtimestamp(day.first_hour, UTC)
    end = datetime.fromtimestamp(day.last_hour + HOUR, UTC)
    book = {"scenario_id": scenario_id}
    with transaction.atomic(), connection.cursor() as cursor:
        # Not flushed at commit: the run's final status commit is synchronous
        # and flushes every day before it (the WAL is one sequence); a crash
        # before then leaves the run unfinished, to re-run.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        if replace:
            PoolHourCost.objects.filter(**book, hour__gte=start, hour__lt=end).delete()
            CostAllocation.objects.filter(**book, hour__gte=start, hour__lt=end).delete()
        tables = (PoolHourCost._meta.db_table, CostAllocation._meta.db_table)
        for table, csv, columns in zip(
            tables, (day.pool_hours_csv, day.rows_csv), day.columns, strict=True
        ):
            if csv:
                with cursor.cursor.copy(
                    f"COPY {table} ({', '.join(columns)}) FROM STDIN WITH (FORMAT csv)"
                ) as copy:
                    copy.write(csv)
        if day.energy_csv is not None:
            energy_day_replace(cursor, start=start, end=end, csv=day.energy_csv, replace=replace)
        then()


def _csv(rows: pa.Table) -> bytes:
    if rows.num_rows == 0:
        return b""
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(rows, sink, pa_csv.WriteOptions(include_header=False))
    return sink.getvalue().to_pybytes()
