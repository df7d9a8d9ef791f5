"""An existing deployment switched to the scaled path: `manage.py
usage_store import-ledger` copies the ledger's raw rows into the store
(an hour a commit; stopped and run again it goes on where it was, never
copying an hour twice), so that late usage to an hour from before the
switch, arriving through the log, rebuilds that hour with everything in
it: the same rollups and attribution as the ledger's path gives for the
same history and the same late request."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings

from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.log.ledger_import import ledger_import
from metering.log.store import RawStore
from metering.log.stream import LogConfig
from metering.log.writer import Writer, _Partition
from metering.models import AttributionShare, UsageRollup
from tests.usage_log import ledger_truncate

pytestmark = pytest.mark.django_db(transaction=True)


def _history(ledger, start: datetime) -> list[dict]:
    events = []
    for n in range(60):  # three hours, both tenants, both replicas
        at = start + timedelta(minutes=3 * n, seconds=n % 7)
        events.append(
            ledger.event(
                f"old-{n}",
                at=at,
                tenant=ledger.b if n % 3 == 0 else ledger.a,
                replica_id=(ledger.replica if n % 2 else ledger.other_replica).pk,
                prompt_tokens=10 + n,
                completion_tokens=5 + n % 11,
            )
        )
    return events


def _snapshot() -> dict:
    rollups = Counter(
        tuple(r)
        for r in UsageRollup.objects.values_list(
            "hour", "tenant_id", "replica_id", "requests_ok", "prompt_tokens", "completion_tokens"
        )
    )
    shares = sorted(
        AttributionShare.objects.values_list(
            "window__replica_id", "window__start", "tenant_id", "requests", "device_ns"
        )
    )
    return {"rollups": rollups, "shares": shares}


def test_a_switched_deployment_rebuilds_an_old_hour_from_the_imported_ledger(
    ledger, tmp_path, settings
):
    now = datetime.now(UTC)
    start = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)
    old = _history(ledger, start)
    late = ledger.event("late-1", at=start + timedelta(minutes=70), prompt_tokens=999)

    # The reference: the ledger's path, the late request recorded there too.
    usage_record_batch(events=[*old, late], source=EventSource.API)
    metering_run(now=now)
    reference = _snapshot()
    assert sum(r[4] * n for r, n in reference["rollups"].items()) > 999
    ledger_truncate()

    # Before the switch: the history on the ledger's path.
    usage_record_batch(events=old, source=EventSource.API)
    metering_run(now=now)
    cfg = {
        **settings.USAGE_LOG,
        "URL": "nats://127.0.0.1:1",
        "STORE_URL": str(tmp_path / "store"),
        "DEAD_LETTER_DIR": str(tmp_path / "dead"),
        "DASK_SCHEDULER": "",
    }
    config = LogConfig.from_settings(cfg)
    store = RawStore(config.store_url, stream=config.stream)
    with override_settings(USAGE_LOG=cfg):
        # The import stopped after its first hour, then run again to the end.
        first = ledger_import(until=start + timedelta(hours=1), config=config)
        assert (first.hours, first.resumed_after) == (1, None)
        call_command("usage_store", "import-ledger")
        again = ledger_import(config=config)  # nothing left: no hour twice
        assert (again.hours, again.events) == (0, 0)
        assert again.resumed_after is not None
        rows = store.read(columns=["request_id"]).column("request_id").to_pylist()
        assert sorted(rows) == sorted(e["request_id"] for e in old)

        # After the switch the late request comes through the log's writer.
        writer = Writer(config, writer_id="w")
        partition = _Partition(0, revision=1, renewed=0.0, committed=0, read_to=1)
        partition.events = [(dict(late, source="api"), 1)]
        assert writer._write([partition]) == 1
        metering_run(now=now)
    assert _snapshot() == reference
