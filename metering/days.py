"""The daily totals (metering.UsageDay) checked against the hourly rollups
they sum, and repaired from them.

Triggers keep the days equal to their hours in the statement that writes
the hours (migration 0007), so a difference means something went around
them: a bulk load with triggers disabled (`session_replication_role =
replica`, `ALTER TABLE ... DISABLE TRIGGER`), a hand-edited day, a restore
of one table without the other. Invoices, budgets and revenue read the
days, so a drifted day is a wrong bill: the daily job
(metering.usage_days_check) finds every day that differs from its hours,
logs it as an error and rebuilds it from its hours, which are the truth.
`manage.py usage_days` does the same over any stretch, month by month."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import connection, transaction

from core.calendar import day_ceil, day_start
from core.locks import advisory_xact_lock
from metering.jobs import RUN_LOCK

logger = logging.getLogger(__name__)

# The hours' sums per day beside the days, where they differ (a day with
# no hours, or hours with no day, included). One statement: one snapshot,
# and the triggers write the days in the statement that writes the hours,
# so a check never sees one without the other.
_DRIFT = """
WITH hours AS (
    SELECT date_trunc('day', hour, 'UTC') AS day, tenant_id, served_model_id,
           sum(prompt_tokens)::bigint AS prompt, sum(cached_tokens)::bigint AS cached,
           sum(completion_tokens)::bigint AS completion, sum(device_seconds) AS seconds,
           count(*) AS rows
    FROM metering_usagerollup
    WHERE served_model_id IS NOT NULL AND hour >= %(start)s AND hour < %(end)s
    GROUP BY 1, 2, 3
), days AS (
    SELECT day, tenant_id, served_model_id, prompt_tokens AS prompt, cached_tokens AS cached,
           completion_tokens AS completion, device_seconds AS seconds, rollup_rows AS rows
    FROM metering_usageday
    WHERE day >= %(start)s AND day < %(end)s
)
SELECT day, tenant_id, served_model_id,
       d.prompt, d.cached, d.completion, d.seconds, d.rows,
       h.prompt, h.cached, h.completion, h.seconds, h.rows
FROM hours h FULL JOIN days d USING (day, tenant_id, served_model_id)
WHERE (h.prompt, h.cached, h.completion, h.seconds, h.rows)
      IS DISTINCT FROM (d.prompt, d.cached, d.completion, d.seconds, d.rows)
ORDER BY day, tenant_id, served_model_id
"""

# The drifted keys' days deleted, then summed again from their hours.
_KEYS = """
SELECT * FROM unnest(%(days)s::timestamptz[], %(tenants)s::bigint[], %(models)s::bigint[])
    AS k (day, tenant_id, served_model_id)
"""
_DELETE = f"""
DELETE FROM metering_usageday d USING ({_KEYS}) k
WHERE d.day = k.day AND d.tenant_id = k.tenant_id AND d.served_model_id = k.served_model_id
"""  # noqa: S608 (constants only)
_REBUILD = f"""
INSERT INTO metering_usageday
    (day, tenant_id, served_model_id, prompt_tokens, cached_tokens,
     completion_tokens, device_seconds, rollup_rows)
SELECT k.day, k.tenant_id, k.served_model_id, sum(r.prompt_tokens), sum(r.cached_tokens),
       sum(r.completion_tokens), sum(r.device_seconds), count(*)
FROM ({_KEYS}) k
JOIN metering_usagerollup r
  ON r.tenant_id = k.tenant_id AND r.served_model_id = k.served_model_id
 AND r.hour >= k.day AND r.hour < k.day + interval '24 hours'
GROUP BY 1, 2, 3
"""  # noqa: S608 (constants only)


@dataclass(frozen=True)
class DayDrift:
    """A day whose totals are not its hours' sums: `held` is what the day
    holds (None: no day), `summed` what its hours add up to (None: no
    hours). Each is (prompt, cached, completion tokens, device-seconds,
    hourly rows)."""

    day: datetime
    tenant_id: int
    served_model_id: int
    held: tuple | None
    summed: tuple | None


def usage_days_check(*, start: datetime, end: datetime) -> list[DayDrift]:
    """Every day from `start`'s to `end`'s (whole UTC days) whose totals
    differ from its hours'. Expected: none."""
    with connection.cursor() as cursor:
        cursor.execute(_DRIFT, {"start": day_start(start), "end": day_ceil(end)})
        return [
            DayDrift(
                day=row[0],
                tenant_id=row[1],
                served_model_id=row[2],
                held=None if row[7] is None else tuple(row[3:8]),
                summed=None if row[12] is None else tuple(row[8:13]),
            )
            for row in cursor.fetchall()
        ]


def usage_days_repair(*, start: datetime, end: datetime) -> list[DayDrift]:
    """Find the drifted days from `start`'s to `end`'s, log each as an
    error and rebuild it from its hours; returns what was found. Checks
    first without a lock (the common case: nothing to repair, and the
    metering job never waits); a drift is checked again holding the
    metering run's lock, so no writer of hours runs between that check and
    the repair."""
    if not usage_days_check(start=start, end=end):
        return []
    with transaction.atomic(), advisory_xact_lock(RUN_LOCK):
        drifted = usage_days_check(start=start, end=end)
        if not drifted:
            return []
        for found in drifted:
            logger.error("usage day drifted from its hours, rebuilt: %s", found)
        keys = {
            "days": [d.day for d in drifted],
            "tenants": [d.tenant_id for d in drifted],
            "models": [d.served_model_id for d in drifted],
        }
        with connection.cursor() as cursor:
            cursor.execute(_DELETE, keys)
            cursor.execute(_REBUILD, keys)
    return drifted
