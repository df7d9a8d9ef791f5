"""The adaptive concurrency limit against a simulated replica whose step
time is known: flat up to a batch of 16, then growing with the batch (a
GPU's shape). Its knee at TOLERANCE: the batch whose step is 1.3x the
floor, 16 x 1.3 = 20.8."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.adaptive import RESERVE_SECONDS, AdaptiveConcurrency
from gateway.concurrency import (
    PROBE_AFTER,
    PROBE_SECONDS,
    PROMISE_SHARE,
    TOLERANCE,
    ConcurrencyLimit,
    Observation,
)
from gateway.fleet import FleetSnapshot, ReplicaInfo, Router

FLAT_UNTIL = 16
BASE_MS = 30.0
KNEE = FLAT_UNTIL * TOLERANCE


@dataclass
class Replica:
    demand: int = 200  # requests the gateway has for it: always more than N
    engine_max: int = 256  # vLLM's max_num_seqs
    slowdown: float = 1.0  # a neighbour on its core

    def interval(self, at: float, n: int) -> Observation:
        running = min(self.demand, n, self.engine_max)
        waiting = max(0, min(self.demand, n) - self.engine_max)
        step = BASE_MS * max(1.0, running / FLAT_UNTIL) * self.slowdown
        return Observation(at=at, step_ms=step, running=running, waiting=waiting)


def run(limit: ConcurrencyLimit, replica: Replica, *, intervals: int, start: float = 0.0):
    """N after each interval, one a second."""
    seen = []
    for i in range(intervals):
        seen.append(limit.observe(replica.interval(start + i, limit.n)))
    return seen


def primed(**kwargs) -> ConcurrencyLimit:
    """A limit that has seen the replica at a small batch (its floor)."""
    limit = ConcurrencyLimit(**kwargs)
    limit.observe(Observation(at=-1, step_ms=BASE_MS, running=1, waiting=0))
    return limit


def test_it_climbs_to_the_knee_within_seconds_and_stays_there():
    limit = primed(start=4)
    seen = run(limit, Replica(), intervals=60)
    first_near = next(i for i, n in enumerate(seen) if 0.8 * KNEE <= n <= 1.2 * KNEE)
    assert first_near <= 10, seen
    assert all(0.75 * KNEE <= n <= 1.25 * KNEE for n in seen[first_near:]), seen
    assert limit.floor_ms == BASE_MS


def test_a_higher_tolerance_holds_a_larger_batch():
    """GATEWAY_CONCURRENCY_TOLERANCE 3 (selling throughput): the knee moves
    to where a step costs 3x the floor, 16 x 3 = 48."""
    seen = run(primed(start=4, tolerance=3.0), Replica(), intervals=60)
    assert all(0.75 * 48 <= n <= 1.25 * 48 for n in seen[-20:]), seen


def test_an_slo_promise_lets_n_past_the_knee_up_to_what_it_allows():
    """Tenants promised an inter-token p95 of 75 ms: the mean step may reach
    PROMISE_SHARE x 75 = 60 ms, 2x the floor, so N holds near 16 x 2 = 32
    (past the knee, 20.8). A promise looser than the knee changes nothing
    below it, and one tighter than the knee does not pull N under it."""
    assert PROMISE_SHARE * 75 / BASE_MS == 2.0
    seen = run(primed(start=4, promise_ms=75.0), Replica(), intervals=60)
    assert all(0.8 * 32 <= n <= 1.2 * 32 for n in seen[-20:]), seen
    assert all(n <= 1.25 * 32 for n in seen), seen
    tight = run(primed(start=4, promise_ms=30.0), Replica(), intervals=60)
    assert all(0.75 * KNEE <= n <= 1.25 * KNEE for n in tight[-20:]), tight


def test_it_backs_off_when_the_replica_slows_and_recovers_when_it_speeds_up():
    limit = primed(start=4)
    replica = Replica()
    run(limit, replica, intervals=30)
    replica.slowdown = 1.6  # a neighbour takes a share of the core
    slowed = run(limit, replica, intervals=20, start=30)
    assert min(slowed[:8]) <= 0.6 * KNEE, slowed  # backed off at once
    replica.slowdown = 1.0
    recovered = run(limit, replica, intervals=20, start=50)
    assert 0.8 * KNEE <= recovered[-1] <= 1.2 * KNEE, recovered
    assert next(i for i, n in enumerate(recovered) if n >= 0.8 * KNEE) <= 10, recovered


def test_a_neighbour_that_stays_is_the_new_normal_once_the_floor_window_passes():
    limit = primed(start=4)
    replica = Replica()
    run(limit, replica, intervals=30)
    replica.slowdown = 1.6
    slowed = run(limit, replica, intervals=90, start=30)
    assert min(slowed[:10]) <= 0.6 * KNEE, slowed  # backed off at once
    assert 0.8 * KNEE <= slowed[-1] <= 1.2 * KNEE, slowed  # the slower replica's knee
    assert limit.floor_ms == BASE_MS * 1.6


def test_an_engine_that_queues_requests_itself_holds_n_to_what_it_runs():
    limit = primed(start=4)
    seen = run(limit, Replica(engine_max=8), intervals=40)
    assert all(n <= 9 for n in seen[10:]), seen  # at most one over: it drops at once
    assert max(seen[10:]) >= 7, seen  # and does not collapse


def test_no_evidence_no_change_and_the_bounds_hold():
    limit = primed(start=6, least=2, most=12)
    assert run(limit, Replica(demand=2), intervals=20)[-1] == 6  # N unused: nothing learned
    assert max(run(limit, Replica(), intervals=40)) == 12  # the knee is past `most`
    limit = primed(start=8, least=3)
    assert min(run(limit, Replica(slowdown=5.0), intervals=40)) == 3


def test_a_replica_always_busy_is_probed_for_its_floor_then_n_goes_back():
    limit = ConcurrencyLimit(start=32)
    busy = Observation(at=0, step_ms=BASE_MS * 4, running=32, waiting=0)
    assert limit.observe(busy) == 4  # no floor: held to a small batch to measure one
    draining = Observation(at=1, step_ms=BASE_MS * 3, running=20, waiting=0)
    assert limit.observe(draining) == 4  # the batch is not small yet
    small = Observation(at=2, step_ms=BASE_MS, running=4, waiting=0)
    assert limit.observe(small) == 32  # measured: back where it was
    assert limit.floor_ms == BASE_MS
    # ... and from there on down to the knee, from what runs.
    assert run(limit, Replica(), intervals=30, start=3)[-1] <= 1.2 * KNEE


def test_a_probe_that_cannot_drain_gives_up_and_is_not_tried_again_at_once():
    """Requests longer than the probe (a slow replica's 30 s ones): the batch
    never drains to FLOOR_BATCH, so after PROBE_SECONDS N goes back to 32
    and stays there, as a fixed N would, until PROBE_AFTER has passed."""
    limit = ConcurrencyLimit(start=32)
    busy = lambda at: Observation(at=at, step_ms=BASE_MS * 1.2, running=30, waiting=0)  # noqa: E731
    probe = int(PROBE_SECONDS)  # intervals of a second
    seen = [limit.observe(busy(at)) for at in range(probe + 60)]
    assert seen[:probe] == [4] * probe, seen
    assert set(seen[probe:]) == {32}, seen
    assert limit.observe(busy(probe + PROBE_AFTER)) == 4  # tried again


def test_one_interval_of_arrivals_waiting_is_not_an_engine_queue():
    limit = primed(start=16)
    arriving = Observation(at=0, step_ms=BASE_MS, running=15, waiting=2)
    assert limit.observe(arriving) >= 16  # requests between two steps
    assert limit.observe(Observation(at=1, step_ms=BASE_MS, running=8, waiting=3)) == 7
    assert limit.observe(Observation(at=2, step_ms=BASE_MS, running=8, waiting=0)) <= 8


def test_n_keeps_a_reserve_under_max_inflight_sized_to_the_overflow_held(monkeypatch):
    """An engine whose knee lies past max_inflight (32): N stops one seat
    under it while no tenant takes overflow, then as many more as the most
    overflow held (or wanted) at once lately, at most ceil(32 / 4) = 8; the
    reserve goes back once that is RESERVE_SECONDS old. Overflow off: no
    reserve."""
    replica = ReplicaInfo(
        id=7, name="r", base_url="http://127.0.0.1:9", model="m", pool_id=1,
        pool_kind="shared", pool_owner_id=None, max_inflight=32, adaptive=True,
    )  # fmt: skip
    router = Router(suspect_seconds=1)
    router.snapshot = FleetSnapshot(replicas_by_model={"m": [replica]}, health_targets=[replica])
    adaptive = AdaptiveConcurrency(router, enabled=True, interval=1, least=1, overflow=1 / 4)
    clock = [100.0]
    monkeypatch.setattr("gateway.adaptive.time.monotonic", lambda: clock[0])
    held: dict[int, int] = {}
    adaptive.overflow_seen = lambda: dict(held)
    assert adaptive.limit(replica) == 31  # the controller starts at 32: one seat spare
    held[7] = 3
    adaptive._overflow_note(clock[0])
    assert adaptive.limit(replica) == 28 and adaptive.state()["r"]["reserve"] == 4
    held[7] = 20  # more than ceil(32 / 4) held: the reserve stops at 8
    adaptive._overflow_note(clock[0])
    assert adaptive.found() == {7: 24}
    held.clear()
    clock[0] += RESERVE_SECONDS + 1
    adaptive._overflow_note(clock[0])
    assert adaptive.limit(replica) == 31
    off = AdaptiveConcurrency(router, enabled=True, interval=1, least=1, overflow=0)
    assert off.limit(replica) == 32


def test_a_slow_drain_is_waited_for_not_cut_again_at_every_interval():
    """Requests that run for tens of seconds: N lowered from 32 takes long to
    show in the batch. Steps of the old batch (2.3x the floor) keep coming
    meanwhile; N is cut once, then held until the batch drains to it, and
    never falls far under the knee of the replica (18 here)."""
    limit = primed(start=32)
    running, seen = 32, []
    for at in range(60):
        n = limit.observe(Observation(at=at, step_ms=BASE_MS * (2.3 if running > 18 else 1.2),
                                      running=running, waiting=0))  # fmt: skip
        seen.append(n)
        running = max(n, running - 1)  # one request ends a second
    assert min(seen) >= 12, seen  # cutting at every interval: 24, 18, 13, 10, 7, 5, 4
    assert seen[-1] >= 14, seen


def test_a_batch_draining_to_a_small_one_is_not_a_floor():
    """An interval that began at 40 running and ended at 3 (a probe
    draining) has the large batch's steps in its mean: it sets no floor,
    or every knee after it would be measured against 80 ms. The next
    interval, small at both ends, does."""
    limit = ConcurrencyLimit(start=64, most=64)
    limit.observe(Observation(at=0, step_ms=80.0, running=3, waiting=0, running_before=40))
    assert limit.floor_ms is None
    limit.observe(Observation(at=1, step_ms=20.0, running=3, waiting=0, running_before=3))
    assert limit.floor_ms == 20.0
