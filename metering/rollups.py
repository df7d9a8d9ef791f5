"""Hourly rollups per (tenant, model, pool, replica, priority): tokens by
kind, requests by status, attributed device-seconds, time in the gateway's
queue (its sum, the requests that recorded it, those that waited) and the
served requests timed by the gateway's window (an engine that reports no
timing). Reports, exports, dashboards and rating read these, never the raw
ledger. An hour is rebuilt whole (delete and insert in one transaction)
whenever usage for it arrives or one of its windows is attributed again;
each replica's load and latency in the hour with it (ReplicaLoadHour)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from metering.models import DirtyHour
from metering.retention import archived_before
from metering.selectors.slo import PG_SECONDS, slo_itl_ms_sql, slo_ttft_ms_sql

# The rollup's usage rows, one per event (`{events}`: the ledger, or the
# raw-event store's events as its engine reads them, metering.log.rollups):
# one text for both paths.
EVENT_ROWS = """
    SELECT date_trunc('hour', received_at) AS hour,
           tenant_id, served_model_id, pool_id, replica_id, priority,
           -- A disaggregated request is billed once: its prompt on the
           -- prefill row, its output on the decode row (which read the
           -- prompt as KV cache; the prefill made one token, not sent).
           CASE WHEN phase = 'decode' THEN 0 ELSE prompt_tokens END AS prompt_tokens,
           CASE WHEN phase = 'decode' THEN 0 ELSE cached_tokens END AS cached_tokens,
           CASE WHEN phase = 'prefill' THEN 0 ELSE completion_tokens END
               AS completion_tokens,
           -- ... and counted once: by the row that answered the client, or by
           -- a prefill that failed (no decode followed).
           CAST(counted AND status = 'ok' AS int) AS ok,
           CAST(counted AND status = 'aborted' AS int) AS aborted,
           CAST(counted AND status = 'error' AS int) AS error,
           CAST(counted AND status = 'rejected' AS int) AS rejected,
           CAST(0 AS bigint) AS device_ns,
           coalesce(gateway_queue_ms, 0) AS gateway_queue_ms,
           CAST(gateway_queue_ms IS NOT NULL AS int) AS gateway_timed,
           CAST(coalesce(gateway_queue_ms > 0, false) AS int) AS gateway_queued,
           CAST(counted AND timing = 'gateway' AND status IN ('ok', 'aborted') AS int)
               AS window_timed,
           synthetic
    FROM {events},
         LATERAL (SELECT phase <> 'prefill' OR status <> 'ok' AS counted) c
"""
ROLLUP_KEYS = ("hour", "tenant_id", "served_model_id", "pool_id", "replica_id", "priority")
ROLLUP_SUMMED = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "ok",
    "aborted",
    "error",
    "rejected",
    "device_ns",
    "gateway_queue_ms",
    "gateway_timed",
    "gateway_queued",
    "window_timed",
)
# The usage rows summed per key, as the store's engine hands them over
# (the same columns as EVENT_ROWS: summed again below, with the shares).
EVENT_ROWS_SUMMED = (
    f"SELECT {', '.join(ROLLUP_KEYS)}, "
    + ", ".join(f"sum({c}) AS {c}" for c in ROLLUP_SUMMED)
    + f", bool_or(synthetic) AS synthetic FROM ({EVENT_ROWS}) usage "
    f"GROUP BY {', '.join(ROLLUP_KEYS)}"
)
_LEDGER_HOURS = """
    WHERE received_at >= %(first)s AND received_at < %(last)s
      AND date_trunc('hour', received_at) = ANY(%(hours)s)
"""

# Every hour in %(hours)s at once: one pass over the ledger's time range
# (`{events}` the ledger's rows of those hours, or the store's summed rows).
_ROLLUP_HOURS = """
INSERT INTO metering_usagerollup
    (hour, tenant_id, served_model_id, pool_id, replica_id, priority,
     prompt_tokens, cached_tokens, completion_tokens,
     requests_ok, requests_aborted, requests_error, requests_rejected,
     device_seconds, gateway_queue_ms_sum, gateway_queue_requests,
     gateway_queued_requests, requests_gateway_timed, synthetic)
SELECT hour, tenant_id, served_model_id, pool_id, replica_id, priority,
       sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens),
       sum(ok), sum(aborted), sum(error), sum(rejected),
       sum(device_ns)::numeric / 1000000000,
       sum(gateway_queue_ms), sum(gateway_timed), sum(gateway_queued),
       sum(window_timed), bool_or(synthetic)
FROM (
    {events}
    UNION ALL
    SELECT date_trunc('hour', w.start), s.tenant_id, s.served_model_id, s.pool_id,
           w.replica_id, s.priority, 0, 0, 0, 0, 0, 0, 0, s.device_ns, 0, 0, 0, 0, false
    FROM metering_attributionwindow w
    JOIN metering_attributionshare s ON s.window_id = w.id
    WHERE w.start >= %(first)s AND w.start < %(last)s
      AND date_trunc('hour', w.start) = ANY(%(hours)s)
) usage
GROUP BY hour, tenant_id, served_model_id, pool_id, replica_id, priority
"""
_ROLLUP_FROM_LEDGER = _ROLLUP_HOURS.format(
    events=EVENT_ROWS.format(events="metering_usageevent") + _LEDGER_HOURS
)


def load_hours_select(*, events: str, seconds: str = PG_SECONDS) -> str:
    """Each replica's load and latency in its hours (metering.models.
    ReplicaLoadHour): every request sent to it, its time there from being
    sent (the gateway's queue is not the replica's load) to its end.
    `events`: the rows (with their WHERE); `seconds`: the engine's exact
    seconds between two timestamps."""
    there = seconds.format(end="e.ended_at", start="coalesce(e.sent_at, e.received_at)")
    return f"""
SELECT date_trunc('hour', e.received_at) AS hour, e.replica_id,
       max(e.served_model_id) AS served_model_id, max(e.pool_id) AS pool_id,
       count(*) FILTER (WHERE e.status = 'ok') AS requests,
       coalesce(sum(e.prompt_tokens + e.completion_tokens)
                FILTER (WHERE e.status IN ('ok', 'aborted')), 0) AS tokens,
       round(CAST(sum(greatest({there}, 0)) AS numeric), 3) AS busy_seconds,
       round(CAST(percentile_cont(0.95) WITHIN GROUP (ORDER BY {slo_ttft_ms_sql(seconds)})
                  AS numeric), 3) AS ttft_p95_ms,
       round(CAST(percentile_cont(0.95) WITHIN GROUP (ORDER BY {slo_itl_ms_sql(seconds)})
                  AS numeric), 3) AS itl_p95_ms,
       bool_or(e.synthetic) AS synthetic
FROM {events}
  AND e.replica_id IS NOT NULL AND e.status <> 'rejected'
GROUP BY 1, 2
"""  # only constant SQL is formatted in; values are parameters


LOAD_HOUR_COLUMNS = (
    "hour",
    "replica_id",
    "served_model_id",
    "pool_id",
    "requests",
    "tokens",
    "busy_seconds",
    "ttft_p95_ms",
    "itl_p95_ms",
    "synthetic",
)
_LOAD_HOURS = (
    f"INSERT INTO metering_replicaloadhour ({', '.join(LOAD_HOUR_COLUMNS)})"
    + load_hours_select(
        events="metering_usageevent e WHERE e.received_at >= %(first)s "
        "AND e.received_at < %(last)s AND date_trunc('hour', e.received_at) = ANY(%(hours)s)"
    )
)


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def rollup_hours_kept(hours) -> list[datetime]:
    """`hours` floored, each once, in order, without those whose events are
    archived (their rollups are all there is)."""
    hours = sorted({hour_floor(h) for h in hours})
    archived = archived_before()
    if archived is not None:
        hours = [h for h in hours if h >= archived]
    return hours


def usage_rollup_hours(*, hours: list[datetime]) -> int:
    """Rebuild the rollups of `hours` from the ledger (delete and insert,
    one transaction); returns the rows written."""
    hours = rollup_hours_kept(hours)
    if not hours:
        return 0
    params = {"hours": hours, "first": hours[0], "last": hours[-1] + timedelta(hours=1)}
    with transaction.atomic(), connection.cursor() as cursor:
        # Derived from the ledger and the shares: see windows._derived_commit.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour = ANY(%s)", [hours])
        cursor.execute(_ROLLUP_FROM_LEDGER, params)
        written = cursor.rowcount
        cursor.execute("DELETE FROM metering_replicaloadhour WHERE hour = ANY(%s)", [hours])
        cursor.execute(_LOAD_HOURS, params)
        return written


_STORE_USAGE = f"""
CREATE TEMP TABLE store_usage (
    hour timestamptz, tenant_id bigint, served_model_id bigint, pool_id bigint,
    replica_id bigint, priority integer,
    {", ".join(f"{c} numeric" for c in ROLLUP_SUMMED)}, synthetic boolean
) ON COMMIT DROP
"""


def usage_rollup_hours_from(*, hours: list[datetime], usage_rows, load_rows) -> int:
    """Rebuild the rollups of `hours` (as kept by rollup_hours_kept) from
    usage rows summed elsewhere (EVENT_ROWS_SUMMED's, over the raw-event
    store) and load hours computed there, with the attribution's shares
    from here: delete and insert, one transaction."""
    if not hours:
        return 0
    params = {"hours": hours, "first": hours[0], "last": hours[-1] + timedelta(hours=1)}
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(_STORE_USAGE)
        columns = (*ROLLUP_KEYS, *ROLLUP_SUMMED, "synthetic")
        with cursor.cursor.copy(f"COPY store_usage ({', '.join(columns)}) FROM STDIN") as copy:
            for row in usage_rows:
                copy.write_row(row)
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour = ANY(%s)", [hours])
        cursor.execute(_ROLLUP_HOURS.format(events="SELECT * FROM store_usage"), params)
        written = cursor.rowcount
        cursor.execute("DELETE FROM metering_replicaloadhour WHERE hour = ANY(%s)", [hours])
        table = f"metering_replicaloadhour ({', '.join(LOAD_HOUR_COLUMNS)})"
        with cursor.cursor.copy(f"COPY {table} FROM STDIN") as copy:
            for row in load_rows:
                copy.write_row(row)
        return written


def usage_rollups_refresh(*, batch_hours: int = 48, rebuild=usage_rollup_hours) -> list[datetime]:
    """Rebuild every hour marked dirty, a couple of days at a time
    (`rebuild`: from the ledger, or the scaled path's from the store); an
    hour marked again while it was being rebuilt stays dirty for the next
    run. Returns the hours rebuilt."""
    dirty = list(DirtyHour.objects.order_by("hour").values_list("hour", "marked_at"))
    for start in range(0, len(dirty), batch_hours):
        batch = dirty[start : start + batch_hours]
        rebuild(hours=[hour for hour, _ in batch])
        for hour, marked_at in batch:
            DirtyHour.objects.filter(hour=hour, marked_at=marked_at).delete()
    return [hour for hour, _ in dirty]


def hours_mark_dirty(*, hours) -> None:
    """Mark `hours` for a rollup rebuild (one statement for all of them)."""
    now = timezone.now()
    DirtyHour.objects.bulk_create(
        [DirtyHour(hour=hour_floor(h), marked_at=now) for h in set(hours)],
        update_conflicts=True,
        unique_fields=["hour"],
        update_fields=["marked_at"],
    )
