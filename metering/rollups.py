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
from metering.selectors.slo import SLO_ITL_MS_SQL, SLO_TTFT_MS_SQL

# Every hour in %(hours)s at once: one pass over the ledger's time range.
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
           (counted AND status = 'ok')::int AS ok,
           (counted AND status = 'aborted')::int AS aborted,
           (counted AND status = 'error')::int AS error,
           (counted AND status = 'rejected')::int AS rejected,
           0::bigint AS device_ns,
           coalesce(gateway_queue_ms, 0) AS gateway_queue_ms,
           (gateway_queue_ms IS NOT NULL)::int AS gateway_timed,
           coalesce(gateway_queue_ms > 0, false)::int AS gateway_queued,
           (counted AND timing = 'gateway' AND status IN ('ok', 'aborted'))::int AS window_timed,
           synthetic
    FROM metering_usageevent,
         LATERAL (SELECT phase <> 'prefill' OR status <> 'ok' AS counted) c
    WHERE received_at >= %(first)s AND received_at < %(last)s
      AND date_trunc('hour', received_at) = ANY(%(hours)s)
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

# Each replica's load and latency in the same hours (metering.models.
# ReplicaLoadHour): every request sent to it, its time there from being
# sent (the gateway's queue is not the replica's load) to its end.
_LOAD_HOURS = f"""
INSERT INTO metering_replicaloadhour
    (hour, replica_id, served_model_id, pool_id, requests, tokens, busy_seconds,
     ttft_p95_ms, itl_p95_ms, synthetic)
SELECT date_trunc('hour', e.received_at), e.replica_id, max(e.served_model_id), max(e.pool_id),
       count(*) FILTER (WHERE e.status = 'ok'),
       coalesce(sum(e.prompt_tokens + e.completion_tokens)
                FILTER (WHERE e.status IN ('ok', 'aborted')), 0),
       round(sum(greatest(extract(epoch FROM e.ended_at - coalesce(e.sent_at, e.received_at)),
                          0))::numeric, 3),
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY {SLO_TTFT_MS_SQL}))::numeric, 3),
       round((percentile_cont(0.95) WITHIN GROUP (ORDER BY {SLO_ITL_MS_SQL}))::numeric, 3),
       bool_or(e.synthetic)
FROM metering_usageevent e
WHERE e.received_at >= %(first)s AND e.received_at < %(last)s
  AND date_trunc('hour', e.received_at) = ANY(%(hours)s)
  AND e.replica_id IS NOT NULL AND e.status <> 'rejected'
GROUP BY 1, 2
"""  # only metering.selectors.slo's constants are formatted in; values are parameters


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def usage_rollup_hours(*, hours: list[datetime]) -> int:
    """Rebuild the rollups of `hours` (delete and insert, one transaction);
    returns the rows written."""
    hours = sorted({hour_floor(h) for h in hours})
    archived = archived_before()
    if archived is not None:  # their events are archived: their rollups are all there is
        hours = [h for h in hours if h >= archived]
    if not hours:
        return 0
    params = {"hours": hours, "first": hours[0], "last": hours[-1] + timedelta(hours=1)}
    with transaction.atomic(), connection.cursor() as cursor:
        # Derived from the ledger and the shares: see windows._derived_commit.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour = ANY(%s)", [hours])
        cursor.execute(_ROLLUP_HOURS, params)
        written = cursor.rowcount
        cursor.execute("DELETE FROM metering_replicaloadhour WHERE hour = ANY(%s)", [hours])
        cursor.execute(_LOAD_HOURS, params)
        return written


def usage_rollups_refresh(*, batch_hours: int = 48) -> list[datetime]:
    """Rebuild every hour marked dirty, a couple of days at a time; an hour
    marked again while it was being rebuilt stays dirty for the next run.
    Returns the hours rebuilt."""
    dirty = list(DirtyHour.objects.order_by("hour").values_list("hour", "marked_at"))
    for start in range(0, len(dirty), batch_hours):
        batch = dirty[start : start + batch_hours]
        usage_rollup_hours(hours=[hour for hour, _ in batch])
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
