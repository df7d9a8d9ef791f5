"""A metering run that reads the store just before a writer's commit lands
leaves the windows it could not see pending: the writer marks them again
once the commit is in (metering.windows keeps a window pending whose mark
moved while it was computed). Without the second mark the run finished
those windows from a table that lacked the writer's events, and cleared
their mark: the events were in the store and never attributed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings

from metering.jobs import metering_run
from metering.log.store import RawStore, table
from metering.log.stream import LogConfig
from metering.log.writer import Writer, _Partition
from metering.models import AttributionShare, AttributionWindow
from tests.ledger import T0

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_run_that_read_the_store_before_a_commit_leaves_its_windows_pending(ledger, tmp_path):
    from django.conf import settings

    cfg = {
        **settings.USAGE_LOG,
        "URL": "nats://127.0.0.1:1",  # the scaled path; no log is read here
        "STORE_URL": str(tmp_path / "store"),
        "DEAD_LETTER_DIR": str(tmp_path / "dead"),
        "DASK_SCHEDULER": "",
    }
    later = T0 + timedelta(hours=2)
    writer = Writer(LogConfig.from_settings(cfg), writer_id="w")
    partition = _Partition(0, revision=1, renewed=0.0, committed=0, read_to=7)
    partition.events = [
        (ledger.event("r1"), 5),
        (ledger.event("r2", tenant=ledger.b), 7),
    ]
    commit = RawStore.commit
    runs = []

    def commit_after_a_run(store, data, positions, **kwargs):
        runs.append(metering_run(now=later))  # reads the table as it is: without r1, r2
        commit(store, data, positions, **kwargs)

    with override_settings(USAGE_LOG=cfg):
        writer.store.commit(table([], ingested_at=T0), {})  # the table exists, empty
        RawStore.commit = commit_after_a_run
        try:
            assert writer._write([partition]) == 2
        finally:
            RawStore.commit = commit
        (during,) = runs
        assert during.windows == 1  # it ran, over a table without the events...
        window = AttributionWindow.objects.get(replica=ledger.replica)
        assert window.status == "pending"  # ...and the window stayed pending
        after = metering_run(now=later)
    assert after.windows == 1
    shares = AttributionShare.objects.filter(window__replica=ledger.replica)
    assert {s.tenant_id: s.requests for s in shares} == {ledger.a.pk: 1, ledger.b.pk: 1}


def test_a_commit_to_the_same_partition_in_between_refuses_the_writers_and_it_reads_again(
    ledger, tmp_path
):
    """Two writers both believing they hold a partition (a lease that ran
    out during a slow commit): the one whose snapshot is older is refused
    by the table (their application transactions conflict), rewinds to
    what the table holds and reads again; no event is stored twice."""
    import asyncio

    from django.conf import settings

    cfg = {
        **settings.USAGE_LOG,
        "URL": "nats://127.0.0.1:1",
        "STORE_URL": str(tmp_path / "store"),
        "DEAD_LETTER_DIR": str(tmp_path / "dead"),
        "LEASE_SECONDS": 600.0,
    }
    config = LogConfig.from_settings(cfg)
    writer = Writer(config, writer_id="slow")
    writer.store.commit(table([], ingested_at=T0), {0: 0})
    stale = writer.store.snapshot()  # what the slow writer read its position from
    other = Writer(config, writer_id="other")
    theirs = _Partition(0, revision=1, renewed=1e18, committed=0, read_to=3)
    theirs.events = [(ledger.event("x1"), 2), (ledger.event("x2"), 3)]
    assert other._write([theirs]) == 2

    import time as clock

    mine = _Partition(0, revision=1, renewed=clock.monotonic(), committed=0, read_to=3)
    mine.events = [(ledger.event("x1"), 2), (ledger.event("x2"), 3)]
    writer.held = {0: mine}
    writer.store.snapshot = lambda: stale
    asyncio.run(writer._commit())
    assert (mine.read_to, mine.events, writer.stats.commits) == (0, [], 0)  # to read again
    assert writer.store.positions([0]) == {0: 3}
    assert sorted(e["request_id"] for e in writer.store.read().to_pylist()) == ["x1", "x2"]
