"""Hourly rollups per (tenant, model, pool, replica, priority): tokens by
kind, requests by status and attributed device-seconds. Reports, exports,
dashboards and rating read these, never the raw ledger. An hour is rebuilt
whole (delete and insert in one transaction) whenever usage for it arrives
or one of its windows is attributed again."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction
from django.utils import timezone

from metering.models import DirtyHour

_ROLLUP_HOUR = """
INSERT INTO metering_usagerollup
    (hour, tenant_id, served_model_id, pool_id, replica_id, priority,
     prompt_tokens, cached_tokens, completion_tokens,
     requests_ok, requests_aborted, requests_error, requests_rejected,
     device_seconds, synthetic)
SELECT %(hour)s, tenant_id, served_model_id, pool_id, replica_id, priority,
       sum(prompt_tokens), sum(cached_tokens), sum(completion_tokens),
       sum(ok), sum(aborted), sum(error), sum(rejected),
       sum(device_ns)::numeric / 1000000000, bool_or(synthetic)
FROM (
    SELECT tenant_id, served_model_id, pool_id, replica_id, priority,
           prompt_tokens, cached_tokens, completion_tokens,
           (status = 'ok')::int AS ok, (status = 'aborted')::int AS aborted,
           (status = 'error')::int AS error, (status = 'rejected')::int AS rejected,
           0::bigint AS device_ns, synthetic
    FROM metering_usageevent
    WHERE received_at >= %(hour)s AND received_at < %(next)s
    UNION ALL
    SELECT s.tenant_id, s.served_model_id, s.pool_id, w.replica_id, s.priority,
           0, 0, 0, 0, 0, 0, 0, s.device_ns, false
    FROM metering_attributionshare s
    JOIN metering_attributionwindow w ON w.id = s.window_id
    WHERE w.start >= %(hour)s AND w.start < %(next)s
) usage
GROUP BY tenant_id, served_model_id, pool_id, replica_id, priority
"""


def hour_floor(moment: datetime) -> datetime:
    return moment.replace(minute=0, second=0, microsecond=0)


def usage_rollup_hour(*, hour: datetime) -> int:
    """Rebuild the rollups of `hour`; returns the rows written."""
    hour = hour_floor(hour)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour = %s", [hour])
        cursor.execute(_ROLLUP_HOUR, {"hour": hour, "next": hour + timedelta(hours=1)})
        return cursor.rowcount


def usage_rollups_refresh() -> list[datetime]:
    """Rebuild every hour marked dirty; an hour marked again while it was
    being rebuilt stays dirty for the next run. Returns the hours rebuilt."""
    rebuilt = []
    for hour, marked_at in DirtyHour.objects.order_by("hour").values_list("hour", "marked_at"):
        usage_rollup_hour(hour=hour)
        DirtyHour.objects.filter(hour=hour, marked_at=marked_at).delete()
        rebuilt.append(hour)
    return rebuilt


def hours_mark_dirty(*, hours) -> None:
    """Mark `hours` for a rollup rebuild (one statement for all of them)."""
    now = timezone.now()
    DirtyHour.objects.bulk_create(
        [DirtyHour(hour=hour_floor(h), marked_at=now) for h in set(hours)],
        update_conflicts=True,
        unique_fields=["hour"],
        update_fields=["marked_at"],
    )
