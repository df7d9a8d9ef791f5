"""The raw-event store's upkeep: a closed hour the writers left as many
small files is one file after compaction, with the same events and the
writers' positions unchanged; the files compacted away are vacuumed; the
open hour is left to the writers; hours past the store's retention are
deleted; the hourly job is a no-op on the ledger's path."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from metering.log.maintenance import _files_by_hour, store_maintain
from metering.log.store import RawStore, hour_key, table
from metering.log.stream import LogConfig
from metering.tasks import store_maintain_task
from metering.validation import EventValidator

pytestmark = pytest.mark.django_db


def _rows(ledger, at: datetime, n: int, *, partition: int, first_seq: int) -> list[tuple]:
    validator = EventValidator(source="api")
    return [
        (
            *validator.row(ledger.event(f"r-{at:%d%H}-{partition}-{first_seq + i}", at=at)),
            partition,
            first_seq + i,
        )
        for i in range(n)
    ]


def _files(store: RawStore) -> dict[str, int]:
    from deltalake import DeltaTable

    return dict(_files_by_hour(DeltaTable(store.url)))


def test_closed_hours_are_compacted_vacuumed_and_past_retention_deleted(ledger, tmp_path, settings):
    now = datetime.now(UTC)
    closed = (now - timedelta(hours=6)).replace(minute=10, second=0, microsecond=0)
    open_ = now.replace(minute=0, second=0, microsecond=0)
    ancient = (now - timedelta(days=120)).replace(minute=10, second=0, microsecond=0)
    cfg = {
        **settings.USAGE_LOG,
        "URL": "nats://127.0.0.1:1",
        "STORE_URL": str(tmp_path / "store"),
        "STORE_VACUUM_HOURS": 0,
    }
    config = LogConfig.from_settings(cfg)
    store = RawStore(config.store_url, stream=config.stream)
    seq = 0
    for hour in (ancient, closed, open_):
        for _ in range(12):  # twelve writer commits, each a small file
            for partition in (0, 1):
                rows = _rows(ledger, hour, 5, partition=partition, first_seq=seq)
                seq += 5
                store.commit(table(rows, ingested_at=now), {partition: seq})
    before_events = sorted(e["request_id"] for e in store.events().to_pylist())
    positions = store.positions([0, 1])
    assert _files(store)[hour_key(closed)] == 24

    seen = []
    with override_settings(USAGE_LOG=cfg):
        done = store_maintain(config=config, progress=lambda n, total: seen.append((n, total)))
    files = _files(store)
    assert files[hour_key(closed)] == 1 and files[hour_key(ancient)] == 1
    assert files[hour_key(open_)] == 24  # still the writers'
    assert done.compacted == [hour_key(ancient), hour_key(closed)]
    assert seen == [(1, 2), (2, 2)]
    assert done.vacuumed == 48  # the small files compacted away, gone from disk
    data = [p for p in (tmp_path / "store").glob("hour=*/*.parquet")]
    assert len(data) == 1 + 1 + 24
    assert list((tmp_path / "store" / "_delta_log").glob("*.checkpoint.parquet"))
    assert sorted(e["request_id"] for e in store.events().to_pylist()) == before_events
    assert store.positions([0, 1]) == positions  # the writers resume where they were

    # Retention: the hours older than it deleted, the rest kept.
    with override_settings(USAGE_LOG={**cfg, "STORE_RETENTION_MONTHS": 2}):
        done = store_maintain(config=config)
    assert done.deleted_hours == [hour_key(ancient)]
    assert hour_key(ancient) not in _files(store)
    assert len(store.events().to_pylist()) == len(before_events) - 12 * 2 * 5
    assert store.positions([0, 1]) == positions

    # From the command, the same (nothing left to do); not on the ledger's path.
    with override_settings(USAGE_LOG=cfg):
        call_command("usage_store", "maintain")
    with override_settings(USAGE_LOG={**cfg, "URL": ""}):
        assert store_maintain_task() == 0
        with pytest.raises(CommandError, match="USAGE_LOG_URL"):
            call_command("usage_store", "maintain")
