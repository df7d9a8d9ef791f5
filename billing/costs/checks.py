"""Checks that allocation results still add up (invariant 3): per pool-hour,
the tenants' rows sum to the allocated cost, allocated + unallocated is the
pool's cost, and no (hour, tenant, pool, model) appears twice in a book.
Expected: nothing. A break is logged as an error and returned."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import connection
from django.utils import timezone

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AllocationBreak:
    scenario_id: int | None
    hour: datetime
    pool_id: int | None
    problem: str


def allocation_conservation_check(*, since: datetime | None = None) -> list[AllocationBreak]:
    since = since or timezone.now() - timedelta(days=35)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.scenario_id, p.hour, p.pool_id,
                   'rows sum to ' || coalesce(a.total, 0) || ', allocated ' || p.allocated
            FROM billing_poolhourcost p
            LEFT JOIN (
                SELECT scenario_id, hour, pool_id, sum(total) AS total
                FROM billing_costallocation WHERE hour >= %s
                GROUP BY scenario_id, hour, pool_id
            ) a ON a.scenario_id IS NOT DISTINCT FROM p.scenario_id
               AND a.hour = p.hour AND a.pool_id = p.pool_id
            WHERE p.hour >= %s
              AND (coalesce(a.total, 0) <> p.allocated
                   OR p.allocated + p.unallocated <> p.total)
            UNION ALL
            SELECT scenario_id, hour, pool_id,
                   count(*) || ' rows for tenant ' || tenant_id || ', model '
                   || coalesce(served_model_id::text, 'none')
            FROM billing_costallocation WHERE hour >= %s
            GROUP BY scenario_id, hour, tenant_id, pool_id, served_model_id
            HAVING count(*) > 1
            UNION ALL
            SELECT a.scenario_id, a.hour, a.pool_id, 'rows with no pool-hour'
            FROM billing_costallocation a
            LEFT JOIN billing_poolhourcost p
              ON a.scenario_id IS NOT DISTINCT FROM p.scenario_id
             AND a.hour = p.hour AND a.pool_id = p.pool_id
            WHERE a.hour >= %s AND p.id IS NULL
            GROUP BY a.scenario_id, a.hour, a.pool_id
            """,
            [since, since, since, since],
        )
        breaks = [AllocationBreak(*row) for row in cursor.fetchall()]
    for found in breaks:
        logger.error("allocation conservation break: %s", found)
    return breaks
