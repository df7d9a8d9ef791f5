"""A replica that stops answering is found down by the gateway's health
checks and routed around, in the database and on /fleet/ with since when
and why, and in the gateway's metrics; started again on the same port, it
is found up and gets requests again. First two gateways' checkers driven
round by round in this process (what each round changes), then a real
gateway process in front of two replica processes, one killed with
SIGKILL and restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from django.conf import settings

from gateway.fleet import Router, fleet_snapshot_load
from gateway.health_checks import HealthChecks
from gateway.telemetry import REGISTRY
from serving.choices import ReplicaStatus
from serving.models import Replica
from serving.services import local_gpu_ensure, pool_ensure, replica_register
from serving.tiny_model import MODEL_NAME
from tests.factories import make_finance_user
from tests.fleet import (
    ROOT,
    Fleet,
    GatewayUrl,
    fleet_done,
    fleet_model,
    gateway_metrics,
    start_gateway,
    stop_gateway,
    wait_for_records,
)
from tests.gateway.fake_upstream import FakeUpstream
from tests.services import free_port

HELLO = [{"role": "user", "content": "hello"}]


def _register(name: str, base_url: str) -> Replica:
    return replica_register(
        name=name,
        base_url=base_url,
        model=fleet_model(),
        pool=pool_ensure(name="shared"),
        gpus=[local_gpu_ensure(serial=f"gpu-{name}")],
    )


def _checker() -> HealthChecks:
    """A gateway's checker: down after 2 failed checks, up after 2 passed."""
    router = Router(suspect_seconds=30)
    router.snapshot = fleet_snapshot_load()
    return HealthChecks(router, interval=1, timeout=2, unhealthy=2, healthy=2)


def _rounds(checks: HealthChecks, count: int) -> None:
    async def rounds() -> None:
        for _ in range(count):
            await checks.check_all()
            await checks.written()

    asyncio.run(rounds())


def _told(*checkers: HealthChecks) -> None:
    """The fleet read again, as a gateway does when told it changed (core.changes)."""
    for checks in checkers:
        checks.router.snapshot = fleet_snapshot_load()


def _sample(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def _routed(checks: HealthChecks) -> set[str]:
    return {r.name for r in checks.router.candidates(MODEL_NAME, tenant_id=1)}


def _fleet_page_replicas(client) -> tuple[dict[str, str], str]:
    client.force_login(make_finance_user())
    page = client.get("/fleet/")
    assert page.status_code == 200
    return {r.name: r.status for r in page.context["replicas"]}, page.content.decode()


def test_two_gateways_find_a_replica_down_and_back_up_each_change_written_once(
    transactional_db, client
):
    one, two = FakeUpstream().start(), FakeUpstream().start()
    try:
        _register("one", one.base_url)
        _register("two", two.base_url)
        first, second = _checker(), _checker()
        _rounds(first, 1)
        assert _sample("gateway_replica_up", replica="one") == 1
        assert _routed(first) == {"one", "two"}
        downs = _sample("gateway_replica_health_transitions_total", replica="one", to="down") or 0

        port = one.port
        one.stop()
        _rounds(first, 1)
        assert _routed(first) == {"one", "two"}  # one failed check changes nothing
        assert Replica.objects.get(name="one").status == ReplicaStatus.UP
        _rounds(first, 1)
        assert _routed(first) == {"two"}
        row = Replica.objects.get(name="one")
        assert row.status == ReplicaStatus.DOWN
        assert "failed 2 health checks in a row; last: GET /health" in row.last_error
        assert row.status_since is not None
        assert _sample("gateway_replica_up", replica="one") == 0
        assert _sample("gateway_replica_up", replica="two") == 1
        transitions = "gateway_replica_health_transitions_total"
        assert _sample(transitions, replica="one", to="down") == downs + 1

        # The other gateway finds the same on its own: nothing new written.
        _rounds(second, 2)
        assert _routed(second) == {"two"}
        assert Replica.objects.get(name="one").status_since == row.status_since
        statuses, html = _fleet_page_replicas(client)
        assert statuses == {"one": "down", "two": "up"}
        assert f"since {row.status_since:%Y-%m-%d %H:%M:%S}" in html

        restarted = FakeUpstream().start(port)
        try:
            _told(first, second)
            _rounds(first, 1)
            assert _routed(first) == {"two"}  # one passed check changes nothing
            _rounds(first, 1)
            _told(first, second)
            assert _routed(first) == {"one", "two"}
            back = Replica.objects.get(name="one")
            assert (back.status, back.last_error) == (ReplicaStatus.UP, "")
            assert back.status_since > row.status_since
            assert _sample("gateway_replica_up", replica="one") == 1
            assert _sample(transitions, replica="one", to="up") >= 1
            _rounds(second, 2)
            assert _routed(second) == {"one", "two"}
            assert Replica.objects.get(name="one").status_since == back.status_since
            assert _fleet_page_replicas(client)[0] == {"one": "up", "two": "up"}
        finally:
            restarted.stop()
    finally:
        two.stop()


def _replica_process(port: int) -> subprocess.Popen:
    """A fake replica in a process of its own on `port`, answering."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.gateway.fake_upstream", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"the fake replica on port {port} never answered")


def _kill(proc: subprocess.Popen) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _replica_up(url: GatewayUrl, name: str) -> float | None:
    return gateway_metrics(url).get(("gateway_replica_up", (("replica", name),)))


def _until(what: str, condition, *, within: float = 15) -> None:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_killed_replica_is_routed_around_and_gets_requests_again_once_restarted(
    transactional_db, client
):
    ports = {"one": free_port(), "two": free_port()}
    procs = {name: _replica_process(port) for name, port in ports.items()}
    gateway, url = start_gateway(
        env={
            "GATEWAY_HEALTH_INTERVAL_SECONDS": "0.2",
            "GATEWAY_HEALTH_TIMEOUT_SECONDS": "1",
            "GATEWAY_HEALTH_UNHEALTHY_THRESHOLD": "2",
            "GATEWAY_HEALTH_HEALTHY_THRESHOLD": "2",
            # A replica that failed a request is not skipped for long: what
            # keeps requests off the dead one is its health, not that.
            "GATEWAY_SUSPECT_SECONDS": "0.01",
        }
    )
    log = Path(settings.VAR_DIR) / "log" / f"test-gateway-{urlsplit(url).port}.log"
    try:
        fleet = Fleet(gateway=url, model=fleet_model())
        fleet.add_tenant("a")
        for name, port in ports.items():
            fleet.add_replica(name, f"http://127.0.0.1:{port}", "shared")
        fleet.ready()
        chat = fleet.client("a", timeout=30).chat.completions

        def served_by(count: int) -> list[str]:
            """`count` requests one after another, each answered 200; the
            replica each ran on, by the ledger."""
            ids = [
                chat.with_raw_response.create(
                    model=MODEL_NAME, messages=HELLO, max_tokens=2
                ).headers["x-request-id"]
                for _ in range(count)
            ]
            records = wait_for_records(ids)
            by_id = {r.pk: name for name, r in fleet.replicas.items()}
            return [by_id[records[i].replica_id] for i in ids]

        assert set(served_by(20)) == {"one", "two"}
        assert _replica_up(url, "one") == 1

        _kill(procs["one"])
        # Requests go on succeeding (before the checks find it down, a
        # request that finds it gone is retried on the other replica).
        served = served_by(5)
        _until("replica one down", lambda: Replica.objects.get(name="one").status == "down")
        tried_before = log.stat().st_size
        assert set(served + served_by(20)) == {"two"}
        with log.open("rb") as lines:  # the gateway logs each failed attempt at a replica
            lines.seek(tried_before)
            assert b": one: " not in lines.read(), "a request was sent to the replica down"
        row = Replica.objects.get(name="one")
        assert "health checks in a row; last: GET /health" in row.last_error
        assert _replica_up(url, "one") == 0
        assert _replica_up(url, "two") == 1
        statuses, html = _fleet_page_replicas(client)
        assert statuses == {"one": "down", "two": "up"}
        assert f"since {row.status_since:%Y-%m-%d %H:%M:%S}" in html

        procs["one"] = _replica_process(ports["one"])
        _until("replica one up", lambda: Replica.objects.get(name="one").status == "up")
        _until("the gateway routing to it", lambda: _replica_up(url, "one") == 1, within=5)
        assert "one" in served_by(20)
        metrics = gateway_metrics(url)
        for to in ("down", "up"):
            key = (
                "gateway_replica_health_transitions_total",
                (("replica", "one"), ("to", to)),
            )
            assert metrics[key] == 1
        assert _fleet_page_replicas(client)[0] == {"one": "up", "two": "up"}
        fleet_done(url)
    finally:
        stop_gateway(gateway)
        for proc in procs.values():
            if proc.poll() is None:
                _kill(proc)
