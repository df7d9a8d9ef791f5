"""Fair queuing across gateway processes through a real Redis: two
FairQueues stand for two gateways. A replica's slots are never granted
beyond its max_inflight across both, are shared by demand, come back from a
gateway that stopped syncing, and tenants' service counters are shared."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from gateway.fairness import FairQueue
from gateway.fairness_redis import FairQueueRedisShare
from tests.services import redis_url, require

REPLICA = 7


@pytest.fixture
def make_pair():
    url = redis_url()
    require(url is not None, "no Redis")
    prefix = f"test-{uuid.uuid4().hex}"

    def make(**kwargs) -> tuple[FairQueueRedisShare, FairQueueRedisShare]:
        return tuple(  # type: ignore[return-value]
            FairQueueRedisShare(
                url, queue=FairQueue(track_service=True), prefix=prefix, gateway_id=name, **kwargs
            )
            for name in ("gw-a", "gw-b")
        )

    return make


def run(make, scenario, **kwargs):
    async def main():
        pair = make(**kwargs)
        try:
            await scenario(*pair)
        finally:
            for share in pair:
                await share.close()

    asyncio.run(main())


async def sync_both(a, b, max_inflight: int, rounds: int = 3) -> None:
    for _ in range(rounds):
        await a.sync({REPLICA: max_inflight})
        await b.sync({REPLICA: max_inflight})


def outstanding(share) -> int:
    return share.queue.outstanding_by_replica().get(REPLICA, 0)


def test_idle_gateways_split_the_slots_as_slack(make_pair):
    async def scenario(a, b):
        await sync_both(a, b, 4)
        slots = [a.queue.acquire_nowait(1, 50, 1, [REPLICA], 10) for _ in range(3)]
        assert [s is not None for s in slots] == [True, True, False]  # its half, at once
        assert b.queue.acquire_nowait(2, 50, 1, [REPLICA], 10) is not None

    run(make_pair, scenario)


def test_slots_follow_demand_and_never_exceed_max_inflight(make_pair):
    async def scenario(a, b):
        await sync_both(a, b, 4)
        waiters = [
            asyncio.create_task(a.queue.acquire(1, 50, 1, [REPLICA], 10, timeout=30))
            for _ in range(6)
        ]
        await asyncio.sleep(0)
        await sync_both(a, b, 4)
        assert outstanding(a) == 4  # b wanted nothing: a has the replica
        assert b.queue.acquire_nowait(2, 50, 1, [REPLICA], 10) is None
        b_waiters = [
            asyncio.create_task(b.queue.acquire(2, 50, 1, [REPLICA], 10, timeout=30))
            for _ in range(3)
        ]
        await asyncio.sleep(0)
        for finished in range(8):
            await sync_both(a, b, 4, rounds=1)
            assert outstanding(a) + outstanding(b) <= 4
            if finished < 3:  # three of a's requests finish, one per round
                running = [w.result() for w in waiters if w.done() and not w.result().released]
                running[0].release(5, 10)
            await asyncio.sleep(0)
        # Both still want more than half: an even split of the contended replica.
        assert (outstanding(a), outstanding(b)) == (2, 2)
        for task in [*waiters, *b_waiters]:
            task.cancel()
        await asyncio.gather(*waiters, *b_waiters, return_exceptions=True)

    run(make_pair, scenario)


def test_slots_dispatched_while_a_sync_is_in_flight_are_never_given_away(make_pair):
    """A gateway samples what it has outstanding, then awaits Redis; what it
    dispatches meanwhile into the slots it holds must not count as free."""

    async def scenario(a, b):
        await a.sync({REPLICA: 2})  # a alone: both slots, as slack
        await b.sync({REPLICA: 2})  # b: nothing free yet
        slots = [a.queue.acquire_nowait(1, 50, 1, [REPLICA], 10) for _ in range(2)]
        assert all(slots)
        real = a.queue.outstanding_by_replica
        a.queue.outstanding_by_replica = dict  # sampled just before the two went out
        b.queue.outstanding_by_replica = lambda: {}
        b.queue.waiting_by_replica = lambda: {REPLICA: 1}  # b wants one
        await a.sync({REPLICA: 2})
        a.queue.outstanding_by_replica = real
        await b.sync({REPLICA: 2})
        assert b.queue.acquire_nowait(2, 50, 1, [REPLICA], 10) is None  # both are in use at a
        for slot in slots:
            slot.release()
        await a.sync({REPLICA: 2})
        await a.sync({REPLICA: 2})
        await b.sync({REPLICA: 2})
        assert b.queue.acquire_nowait(2, 50, 1, [REPLICA], 10) is not None  # now it may

    run(make_pair, scenario)


def test_a_gateway_that_stops_syncing_loses_its_slots_after_the_lease(make_pair):
    async def scenario(a, b):
        await sync_both(a, b, 2)
        assert a.queue.acquire_nowait(1, 50, 1, [REPLICA], 10) is not None
        waiters = [
            asyncio.create_task(b.queue.acquire(2, 50, 1, [REPLICA], 10, timeout=30))
            for _ in range(2)
        ]
        await asyncio.sleep(0)
        await b.sync({REPLICA: 2})
        assert outstanding(b) == 1  # a holds the other slot, in use
        await asyncio.sleep(0.4)  # a is silent past its lease
        await b.sync({REPLICA: 2})
        await asyncio.sleep(0)
        assert outstanding(b) == 2
        await asyncio.gather(*waiters)

    run(make_pair, scenario, lease_seconds=0.3)


def test_service_counters_are_shared(make_pair):
    async def scenario(a, b):
        await sync_both(a, b, 2)
        slot = a.queue.acquire_nowait(1, 50, 1, [REPLICA], 100)
        slot.release(output_tokens=50, input_tokens=100)  # 100 + 2 x 50
        await a.sync({REPLICA: 2})
        slot = b.queue.acquire_nowait(1, 50, 1, [REPLICA], 10)
        await b.sync({REPLICA: 2})
        assert b.queue.tenant_service(1) == 210  # a's service counts on b
        slot.release(0, 10)
        await a.sync({REPLICA: 2})
        assert a.queue.tenant_service(1) == 200  # a hears of b's only when it needs to

    run(make_pair, scenario)


def test_changes_kept_for_a_failed_sync_compose_with_later_ones():
    """Drained changes put back ahead of newer ones give the same counter as
    sharing both rounds in turn: max(max(G, F1) + d1, F2) + d2."""
    fq = FairQueue(track_service=True)
    fq._floors, fq._deltas = {1: 400.0}, {1: 7.0}  # (F2, d2): made after the drain
    fq.service_restore({1: 100.0}, {1: 30.0})  # (F1, d1): drained, not shared
    floors, deltas = fq.service_drain()
    for shared in (0.0, 150.0, 450.0, 900.0):
        by_rounds = max(max(shared, 100.0) + 30.0, 400.0) + 7.0
        assert max(shared, floors[1]) + deltas[1] == by_rounds
