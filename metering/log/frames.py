"""A replica's requests read from the raw-event store, in the frame the
attribution reads from the ledger (metering.windows.events_frames): the
same columns, the same types, the same arithmetic on times (integer
microseconds, exact), so one attribution (metering.windows.replica_compute)
serves both paths.

Only the hour partitions a window's requests can end in are opened (a
request resident in [start, end) ends after `start` and before `end` plus
the longest request), and each (request id, phase) is taken once."""

from __future__ import annotations

from datetime import datetime, timedelta

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from metering.log.store import RawStore, hour_key

_SELECT = """
SELECT
    replica_id, request_id, tenant_id, served_model_id, pool_id, priority,
    epoch_us(coalesce(sent_at, received_at)) AS sent_us,
    epoch_us(first_token_at) AS first_token_us,
    epoch_us(ended_at) AS ended_us,
    CAST(queue_ms * 1000 AS BIGINT) AS queue_us,
    CAST(ttft_ms * 1000 AS BIGINT) AS ttft_us,
    CAST(generation_ms * 1000 AS BIGINT) AS generation_us,
    prompt_tokens, cached_tokens, completion_tokens,
    CAST(phase = 'decode' AS BIGINT) AS decode_only
FROM events
"""
NULLABLE = ("served_model_id", "pool_id", "first_token_us", "queue_us", "ttft_us", "generation_us")


def hours_between(start: datetime, end: datetime) -> list[str]:
    """The hour partitions from `start`'s to `end`'s, both included."""
    hour = start.replace(minute=0, second=0, microsecond=0)
    found = []
    while hour <= end:
        found.append(hour_key(hour))
        hour += timedelta(hours=1)
    return found


def store_events_frames(
    store: RawStore,
    *,
    replica_ids: list[int],
    start: datetime,
    end: datetime,
    max_request_seconds: int,
) -> dict[int, pd.DataFrame]:
    """The requests resident on each of `replica_ids` during [start, end),
    a frame per replica, as events_frames gives them."""
    longest = timedelta(seconds=max_request_seconds)
    lookback = start - longest
    ids = [int(r) for r in replica_ids]
    condition = (
        pc.field("replica_id").isin(ids)
        & (pc.field("status") != "rejected")
        & (pc.field("received_at") >= pa.scalar(lookback, pa.timestamp("us", "UTC")))
        & (pc.field("received_at") < pa.scalar(end, pa.timestamp("us", "UTC")))
        & (pc.field("ended_at") > pa.scalar(start, pa.timestamp("us", "UTC")))
    )
    events = store.events(hours_between(start, end + longest), where=condition)
    with duckdb.connect() as db:
        db.register("events", events)
        table = db.sql(_SELECT).to_arrow_table()
    frame = table.to_pandas(types_mapper={pa.int64(): pd.Int64Dtype()}.get)
    frame = frame.astype({c: "int64" for c in frame.columns if c not in (*NULLABLE, "request_id")})
    parts = {
        int(replica_id): part.reset_index(drop=True)
        for replica_id, part in frame.groupby("replica_id", sort=False)
    }
    return {r: parts[r] if r in parts else frame.iloc[:0] for r in ids}
