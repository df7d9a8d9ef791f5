"""The scaled path's hourly rollups and replica load hours, computed over
the raw-event store by DuckDB with the ledger's own SQL (metering.rollups:
EVENT_ROWS and load_hours_select, one text for both engines; only the
exact seconds between two timestamps are said in DuckDB's functions), on
a Dask worker; PostgreSQL then adds the attribution's shares and replaces
the hours whole (metering.rollups.usage_rollup_hours_from)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from metering.log.duck import DUCKDB_SECONDS, duck
from metering.log.frames import hours_between
from metering.log.store import RawStore
from metering.rollups import EVENT_ROWS_SUMMED, load_hours_select

UTC_US = pa.timestamp("us", "UTC")


def store_rollup_rows(
    *, store_url: str, stream: str, hours: list[datetime], max_request_seconds: int
) -> tuple[list[tuple], list[tuple]]:
    """On a worker: the usage rows summed per rollup key, and the load
    hours, of the events received in `hours` (in the hour partitions they
    can have ended in), each (request id, phase) once."""
    if not hours:
        return [], []
    first, last = min(hours), max(hours) + timedelta(hours=1)
    where = (pc.field("received_at") >= pa.scalar(first, UTC_US)) & (
        pc.field("received_at") < pa.scalar(last, UTC_US)
    )
    store = RawStore(store_url, stream=stream)
    ended = hours_between(first, last + timedelta(seconds=max_request_seconds))
    events = store.events(ended, where=where)
    wanted = pa.array(sorted(hours), type=UTC_US)
    events = events.filter(pc.is_in(pc.floor_temporal(events["received_at"], unit="hour"), wanted))
    with duck(events=events) as db:
        usage = db.execute(EVENT_ROWS_SUMMED.format(events="events")).fetchall()
        load = db.execute(
            load_hours_select(events="events e WHERE true", seconds=DUCKDB_SECONDS)
        ).fetchall()
    return usage, load
