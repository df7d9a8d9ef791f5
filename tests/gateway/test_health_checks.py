"""Replica health checks: the thresholds (a replica goes down after K
failed checks in a row and back up after M passed ones, never on one),
what a change heard from the database does, routing around a replica
down, and what one check asks a (fake) engine."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import replace

from gateway.fleet import FleetSnapshot, ReplicaInfo, Router
from gateway.health_checks import DOWN_ELSEWHERE, HealthBook, HealthChecks
from serving.choices import Engine, ReplicaRole
from tests.gateway.fake_engines import FakeEngine
from tests.gateway.fake_upstream import FakeUpstream
from tests.gateway.replicas import replica

FAIL = "GET /health: cannot connect"


def book(*, unhealthy: int = 3, healthy: int = 2, up: dict[int, bool] | None = None) -> HealthBook:
    clock = itertools.count(1000)
    health = HealthBook(unhealthy=unhealthy, healthy=healthy, clock=lambda: float(next(clock)))
    health.sync(up if up is not None else {1: True})
    return health


def feed(health: HealthBook, results: str, replica_id: int = 1) -> list:
    """`results`: one letter a check, `.` passed and `x` failed; the changes made."""
    changes = []
    for result in results:
        change = health.observe(replica_id, error=FAIL if result == "x" else None)
        if change is not None:
            changes.append(change)
    return changes


def test_down_only_after_the_unhealthy_threshold_of_failures_in_a_row():
    health = book(unhealthy=3)
    assert feed(health, "xx.xx.") == []  # a pass between failures starts the count again
    assert health.down_ids() == set()
    (change,) = feed(health, "xxx")
    assert (change.replica_id, change.up, change.heard) == (1, False, False)
    assert change.reason == f"failed 3 health checks in a row; last: {FAIL}"
    state = health.states[1]
    assert (state.up, state.unwritten, state.reason) == (False, True, change.reason)
    assert health.down_ids() == {1}
    assert feed(health, "xxxx") == []  # down stays down: no change to write again


def test_up_again_only_after_the_healthy_threshold_of_passes_in_a_row():
    health = book(unhealthy=2, healthy=3)
    feed(health, "xx")
    since_down = health.states[1].since
    assert feed(health, "..x..x") == []  # a failure between passes starts the count again
    assert health.states[1].since == since_down
    (change,) = feed(health, "...")
    assert (change.up, change.reason) == (True, "passed 3 health checks in a row")
    assert health.states[1].up
    assert health.states[1].since > since_down
    assert health.down_ids() == set()


def test_a_check_failing_every_other_time_never_flaps():
    health = book(unhealthy=2, healthy=2)
    assert feed(health, "x." * 50) == []
    assert health.states[1].up
    feed(health, "xx")
    assert feed(health, ".x" * 50) == []
    assert not health.states[1].up


def test_thresholds_of_one_change_on_every_new_result():
    health = book(unhealthy=1, healthy=1)
    assert [c.up for c in feed(health, "x.x.")] == [False, True, False, True]


def test_a_replica_starts_as_the_database_says_and_is_forgotten_when_gone():
    health = book(up={1: True, 2: False})
    assert health.down_ids() == {2}
    assert not health.states[2].unwritten  # the database says so already
    (change,) = feed(health, "..", replica_id=2)  # a replica down there comes back here
    assert change.up and health.states[2].unwritten
    assert health.sync({1: True}) == []
    assert set(health.states) == {1}
    assert health.observe(2, error=FAIL) is None  # its check ended after it went


def test_down_in_the_database_takes_it_out_here_until_it_passes_here():
    """Another gateway (or the scraper) found it down: this one stops
    routing there too, writes nothing, and needs its own passes to bring
    it back (and then writes that)."""
    health = book(unhealthy=3, healthy=2)
    feed(health, "...")
    (heard,) = health.sync({1: False})
    assert (heard.up, heard.heard, heard.reason) == (False, True, DOWN_ELSEWHERE)
    assert health.down_ids() == {1} and not health.states[1].unwritten
    assert health.sync({1: False}) == []  # heard once, not every snapshot
    assert feed(health, ".") == []
    (back,) = feed(health, ".")
    assert back.up and not back.heard and health.states[1].unwritten
    # The database says down until the write lands: that is not news.
    assert health.sync({1: False}) == []
    assert health.states[1].up


def test_up_in_the_database_does_not_bring_back_one_down_here():
    health = book(unhealthy=1, healthy=2, up={1: False})
    assert health.sync({1: True}) == []
    assert health.down_ids() == {1}


def test_zero_thresholds_mean_one():
    health = book(unhealthy=0, healthy=0)
    assert [c.up for c in feed(health, "x.")] == [False, True]


def info(rid: int, *, role: str = ReplicaRole.BOTH, pool: int | None = None) -> ReplicaInfo:
    return replica(rid, pool=pool, role=role)


def router(*replicas: ReplicaInfo) -> Router:
    r = Router(suspect_seconds=60)
    r.snapshot = FleetSnapshot(replicas_by_model={"m": list(replicas)})
    return r


def test_routing_never_picks_a_replica_down_while_one_is_up():
    r = router(info(1), info(2), info(3))
    r.inflight = {2: 1, 3: 1}  # the idle one, 1, would be first
    r.mark_suspect(r.snapshot.replicas_by_model["m"][1])
    r.down = {1}
    assert [c.id for c in r.candidates("m", tenant_id=5)] == [3, 2]  # suspect last, down never
    r.down = {1, 3}
    assert [c.id for c in r.candidates("m", tenant_id=5)] == [2]  # one left: the hot path
    r.down = {1, 2, 3}
    assert r.candidates("m", tenant_id=5) == []  # answered 503 no_replica, nothing tried


def test_a_decode_replica_down_is_not_a_second_hop():
    prefill = info(1, role=ReplicaRole.PREFILL, pool=9)
    r = router(
        prefill, info(2, role=ReplicaRole.DECODE, pool=9), info(3, role=ReplicaRole.DECODE, pool=9)
    )
    r.down = {2}
    assert [c.id for c in r.decode_candidates(prefill)] == [3]
    r.down = {2, 3}
    assert r.decode_candidates(prefill) == []


def _check(replica: ReplicaInfo) -> str | None:
    checks = HealthChecks(router(), interval=1, timeout=2, unhealthy=1, healthy=1)
    return asyncio.run(checks.check(replica))


def test_a_check_asks_the_engines_own_health_endpoint_and_wants_a_2xx():
    """vLLM's GET /health answers 503 once its engine died; an
    OpenAI-compatible server with no health endpoint is asked GET /v1/models."""
    vllm, other = FakeUpstream().start(), FakeEngine(Engine.OPENAI).start()
    try:
        assert _check(replace(info(1), base_url=vllm.base_url)) is None
        vllm.healthy = False
        assert _check(replace(info(1), base_url=vllm.base_url)) == "GET /health: HTTP 503"
        assert _check(replace(info(2), base_url=other.base_url, engine=Engine.OPENAI)) is None
        # /health there is a 404: asked, it would have failed.
        assert _check(replace(info(2), base_url=other.base_url)) == "GET /health: HTTP 404"
    finally:
        vllm.stop()
        other.stop()
    assert "cannot connect" in _check(replace(info(1), base_url=vllm.base_url))


def test_a_busy_replica_whose_health_check_times_out_is_not_failed_for_it():
    """A saturated engine still serving answers its health endpoint late:
    a timeout on a replica that answered a request within the last round is
    not a failure; on one that answered none it is, and a replica that
    refuses connections fails whatever it answered before."""
    import socket

    listener = socket.socket()  # accepts connections (its backlog) and never answers
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    silent = replace(info(1), base_url=f"http://127.0.0.1:{listener.getsockname()[1]}")
    r = router(silent)
    checks = HealthChecks(r, interval=0.5, timeout=0.2, unhealthy=1, healthy=1)
    try:
        assert asyncio.run(checks.check(silent)) == "GET /health: no answer within 0.2 s"
        r.answered(silent)
        assert asyncio.run(checks.check(silent)) is None  # busy serving, not gone
        r._answered_at[silent.id] -= 1.0  # its last answer a round and more ago
        assert asyncio.run(checks.check(silent)) == "GET /health: no answer within 0.2 s"
    finally:
        listener.close()
    r.answered(silent)
    assert "cannot connect" in asyncio.run(checks.check(silent))
