"""The month's edges, on a clock moved there: usage received on the 1st at
00:00, on the last day and at 23:59:59 UTC is recorded through the ingest
API, whichever month's partition is missing (a month before the ones
`migrate` creates answered 500 once: issue 59, item 0). The invoice page's
side: tests/dashboard/test_month_edges_page.py."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from metering.models import UsageEvent
from metering.partitions import partition_name
from tenants.services import service_key_create
from tests.conftest import PINNED_NOW, client_for_key

NEXT_MONTH = datetime(PINNED_NOW.year, PINNED_NOW.month + 1, 1, tzinfo=UTC)
EDGES = {
    "the 1st at 00:00": NEXT_MONTH,
    "the last day at noon": NEXT_MONTH - timedelta(hours=12),
    "the last day at 23:59:59": NEXT_MONTH - timedelta(seconds=1),
}


def _partition_exists(month: datetime) -> bool:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s)", [partition_name(month.date())])
        return cursor.fetchone()[0] is not None


@pytest.mark.parametrize("instant", EDGES.values(), ids=EDGES.keys())
def test_usage_at_the_months_edges_is_recorded_in_its_own_month(ledger, pinned_clock, instant):
    pinned_clock.move_to(instant, tick=False)
    _key, secret = service_key_create(name="edge fleet")
    reporter = client_for_key(secret)
    # Ten months back: inside the 13-month horizon, before any partition
    # `migrate` makes (it starts at the month before the machine's own).
    old = datetime(instant.year - 1, instant.month, 1, tzinfo=UTC) + timedelta(days=62)
    events = [
        ledger.event("edge-now", at=instant - timedelta(seconds=1)),
        ledger.event("edge-old", at=old),
    ]
    events[0]["ended_at"] = instant
    body = [orjson.loads(orjson.dumps(e, default=str)) for e in events]

    response = reporter.post("/api/v1/usage/events", body, format="json")

    assert response.status_code == 200, response.json()
    assert response.json()["accepted"] == 2
    stored = dict(UsageEvent.objects.values_list("request_id", "received_at"))
    assert stored == {"edge-now": instant - timedelta(seconds=1), "edge-old": old}
    assert _partition_exists(old) and _partition_exists(instant - timedelta(seconds=1))
