"""The scaled usage path under the faults it is built for, each caused for
real under steady traffic from two tenants (USD and EUR) through two
`manage.py gateway` processes: the stream's leader SIGKILLed, a writer
SIGKILLed, the whole JetStream cluster away for a minute. Afterwards
every request a client saw answered is in the raw-event store once, to
the token, and nothing the clients were not answered is."""

from __future__ import annotations

import os
import signal
import time

import pytest

from metering.log.store import RawStore
from tests.fleet import start_gateway, stop_gateway, wait_for_fleet
from tests.usage_log import (
    Steady,
    log_config,
    log_env,
    spooled,
    start_writer,
    stored,
    stream_info,
    wait_for,
    wait_for_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)

OUTAGE_SECONDS = 60


class Scaled:
    """Two writers and two gateways on the scaled path."""

    def __init__(self, cluster, tmp_path, **env) -> None:
        self.store_dir = tmp_path / "store"
        self.env = log_env(cluster, self.store_dir, **env)
        self.config = log_config(cluster, self.store_dir)
        self.store = RawStore(str(self.store_dir), stream=self.config.stream)
        self.tmp_path = tmp_path
        self.writers = {}
        self.gateways = []

    def __enter__(self) -> Scaled:
        for name in ("w1", "w2"):
            self.writers[name] = start_writer(self.env, name, self.tmp_path)
        wait_for_stream(self.config)
        self.gateways = [start_gateway(env=self.env) for _ in range(2)]
        for _, url in self.gateways:
            wait_for_fleet(url, replicas=2)
        return self

    @property
    def urls(self) -> list:
        return [url for _, url in self.gateways]

    def drained(self, want: dict, *, timeout: float = 60) -> dict:
        """Once the gateways' spools are empty and every answered request is
        stored: what the store holds."""
        wait_for(
            lambda: all(spooled(url) == 0 for url in self.urls),
            timeout=timeout,
            what="the gateways' spools drained into the log",
        )
        return wait_for(
            lambda: (found := stored(self.store)).keys() >= want.keys() and found,
            timeout=timeout,
            what="every answered request in the store",
        )

    def __exit__(self, *exc) -> None:
        for proc, _ in self.gateways:
            stop_gateway(proc)
        for writer in self.writers.values():
            writer.stop()


def _exactly(got: dict, want: dict) -> None:
    assert {rid: got[rid] for rid in want} == want
    # Nothing stored that no client was answered (a fake upstream answers
    # every request, so every recorded request was answered).
    assert got.keys() == want.keys(), sorted(got.keys() - want.keys())[:5]


def test_the_stream_leader_killed_under_traffic_loses_nothing_and_counts_nothing_twice(
    world, nats_cluster, tmp_path
):
    with Scaled(nats_cluster, tmp_path) as scaled:
        steady = Steady(world, scaled.urls).start()
        time.sleep(4)
        leader = stream_info(scaled.config).cluster.leader
        nats_cluster.kill(leader)
        time.sleep(8)  # a new leader elected meanwhile (about 5 s here)
        new_leader = stream_info(scaled.config).cluster.leader
        nats_cluster.restart(leader)  # catches up from the new leader
        time.sleep(4)
        steady.stop()
        want = steady.answered
        assert len(want) > 100, steady.failed[:3]
        assert not steady.failed, steady.failed[:3]  # the spools held what the log could not take
        got = scaled.drained(want)
        _exactly(got, want)
        assert new_leader and new_leader != leader


def test_a_writer_killed_mid_hour_its_partitions_resume_and_hold_each_event_once(
    world, nats_cluster, tmp_path
):
    with Scaled(nats_cluster, tmp_path) as scaled:
        steady = Steady(world, scaled.urls).start()
        time.sleep(5)
        killed = scaled.writers["w1"]
        os.kill(killed.pid, signal.SIGKILL)
        killed.popen.wait(timeout=10)
        time.sleep(8)  # its leases lapse (3 s) and w2 takes its partitions
        steady.stop()
        want = steady.answered
        assert len(want) > 100 and not steady.failed, steady.failed[:3]
        got = scaled.drained(want)
        _exactly(got, want)
        # Exactly once in the table itself, not only as read: the survivor
        # went on from the position each partition's last commit holds.
        rows = scaled.store.read(columns=["request_id", "phase"]).to_pylist()
        assert len(rows) == len(want)
        log = (tmp_path / "usage-writer-w2.log").read_text()
        assert "took partition" in log


def test_jetstream_away_for_a_minute_the_spools_hold_then_drain(world, nats_cluster, tmp_path):
    with Scaled(nats_cluster, tmp_path) as scaled:
        steady = Steady(world, scaled.urls).start()
        time.sleep(3)
        for node in nats_cluster.nodes:
            nats_cluster.kill(node.name)
        time.sleep(OUTAGE_SECONDS)
        during = len(steady.answered)
        held = sum(spooled(url) for url in scaled.urls)
        nats_cluster.restart(*(node.name for node in nats_cluster.nodes))
        time.sleep(3)
        steady.stop()
        want = steady.answered
        assert not steady.failed, steady.failed[:3]  # served on, the spools holding
        assert held > 100, held
        assert during > 200, during
        got = scaled.drained(want, timeout=120)
        _exactly(got, want)
        for url in scaled.urls:  # one line when it went, one when it came back
            log = url.log.read_text()
            assert log.count("the usage log is unavailable") == 1, url.log
            assert log.count("the usage log is available again") == 1, url.log
            assert "Traceback" not in log, url.log
