"""The latest requests read from the store keep only the last few rows of
an hour, however many it holds, each (request id, phase) once: the one
first on the log, should a record have been published twice past the
log's duplicate window."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pyarrow.compute as pc
import pytest

from metering.log.store import RawStore, hour_key, table
from metering.validation import EventValidator

pytestmark = pytest.mark.django_db


def test_the_latest_rows_of_an_hour_each_request_once_newest_first(ledger, tmp_path):
    store = RawStore(str(tmp_path / "store"), stream="USAGE")
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    validator = EventValidator(source="api")
    rows = [
        (*validator.row(ledger.event(f"r{n:03}", at=start + timedelta(seconds=n))), 0, n + 1)
        for n in range(200)
    ]
    # The last three published again, later on the log (past its window).
    again = [(*row[:-1], 1000 + i) for i, row in enumerate(rows[-3:])]
    store.commit(table(rows + again, ingested_at=start), {0: 1003})
    latest = store.latest([hour_key(start)], where=pc.field("tenant_id") > 0, limit=5)
    assert latest.column("request_id").to_pylist() == ["r199", "r198", "r197", "r196", "r195"]
    assert latest.column("log_seq").to_pylist() == [200, 199, 198, 197, 196]  # the first on the log
    assert store.latest([], where=pc.field("tenant_id") > 0, limit=5).num_rows == 0
