"""The gateway's fair queue: flow control per replica, weighted fair sharing
across tenants (VTC), priority classes with a starvation bound, owner-first
dedicated replicas, and clean exits (timeout, bound, cancellation)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter, deque
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.fairness import FairQueue, QueueFull, QueueTimeout, Slot

LONG = 60.0  # a queue timeout no test reaches
W_OUT = 2


@dataclass(frozen=True)
class Load:
    prompt: int
    output: int
    weight: float = 1.0
    priority: int = 50

    @property
    def service(self) -> int:
        return self.prompt + W_OUT * self.output


class Backlog:
    """Tenants that keep requests waiting at all times, and a replica that
    completes its oldest in-flight request on each step."""

    def __init__(self, fq: FairQueue, *, replica_id: int = 1, slots: int = 4) -> None:
        self.fq = fq
        self.replica_id = replica_id
        self.slots = slots
        fq.replica_set(replica_id, max_inflight=slots)
        self.running: deque[tuple[Slot, Load, asyncio.Future]] = deque()
        self.tasks: list[asyncio.Task] = []
        self.order: list[int] = []  # tenant of each completion

    def tenant_start(self, tenant_id: int, load: Load) -> None:
        for _ in range(self.slots + 2):  # more than can be in flight: always backlogged
            self.tasks.append(asyncio.create_task(self._worker(tenant_id, load)))

    async def _worker(self, tenant_id: int, load: Load) -> None:
        loop = asyncio.get_running_loop()
        while True:
            slot = await self.fq.acquire(
                tenant_id, load.priority, load.weight, [self.replica_id], load.prompt, timeout=LONG
            )
            done = loop.create_future()
            self.running.append((slot, load, done))
            await done

    async def settle(self) -> None:
        for _ in range(5):
            await asyncio.sleep(0)

    async def complete(self, n: int) -> Counter:
        """Complete n requests; the service each tenant got from them."""
        service: Counter = Counter()
        for _ in range(n):
            while not self.running:
                await asyncio.sleep(0)
            slot, load, done = self.running.popleft()
            slot.release(output_tokens=load.output, input_tokens=load.prompt)
            done.set_result(None)
            service[slot.tenant_id] += load.service
            self.order.append(slot.tenant_id)
        return service

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for slot, _, _ in self.running:
            slot.release()


def run(scenario):
    async def bounded():
        await asyncio.wait_for(scenario(), 10)  # a broken queue fails, not hangs

    asyncio.run(bounded())


def within(a: float, b: float, tolerance: float = 0.10) -> bool:
    return abs(a - b) <= tolerance * max(a, b)


# --- fairness --------------------------------------------------------------


def test_equal_weights_different_sizes_get_equal_service():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT)
        bench = Backlog(fq)
        bench.tenant_start(1, Load(prompt=400, output=10))  # 420 per request
        bench.tenant_start(2, Load(prompt=20, output=100))  # 220 per request
        await bench.complete(50)
        service = await bench.complete(600)
        await bench.close()
        assert within(service[1], service[2]), service
        # service, not requests, is shared: the small requests go about twice as often
        counts = Counter(bench.order[50:])
        assert counts[2] > 1.6 * counts[1]

    run(scenario)


def test_weights_two_to_one_get_two_to_one():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT)
        bench = Backlog(fq)
        bench.tenant_start(1, Load(prompt=100, output=50, weight=2))
        bench.tenant_start(2, Load(prompt=100, output=50, weight=1))
        await bench.complete(50)
        service = await bench.complete(600)
        await bench.close()
        assert within(service[1], 2 * service[2]), service

    run(scenario)


def test_idle_tenant_returning_cannot_hoard_credit():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT)
        bench = Backlog(fq)
        load = Load(prompt=100, output=50)
        bench.tenant_start(1, load)
        bench.tenant_start(2, load)
        await bench.complete(300)
        assert fq.tenant_service(3) == 0  # idle all along
        bench.tenant_start(3, load)
        await bench.settle()
        backlogged_min = min(fq.tenant_service(1), fq.tenant_service(2))
        assert fq.tenant_service(3) == backlogged_min  # lifted on joining
        service = await bench.complete(600)
        await bench.close()
        # a third each from here on, not a catch-up burst for tenant 3
        assert within(service[3], service[1]), service
        assert within(service[3], service[2]), service
        first = Counter(bench.order[300:360])
        assert first[3] <= 25, first  # 60 completions: about 20 each

    run(scenario)


def test_a_tenant_served_alone_is_not_penalised_when_others_arrive():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT)
        bench = Backlog(fq)
        load = Load(prompt=100, output=50)
        bench.tenant_start(1, load)
        await bench.complete(300)  # tenant 1 alone: all of the replica
        bench.tenant_start(2, load)
        service = await bench.complete(600)
        await bench.close()
        assert within(service[1], service[2]), service
        assert Counter(bench.order[300:340])[1] >= 15  # not shut out while 2 "catches up"

    run(scenario)


def test_idle_return_with_nobody_backlogged_starts_at_the_last_served_level():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT)
        fq.replica_set(1, max_inflight=10)
        for _ in range(20):
            (await fq.acquire(1, 50, 1, [1], 100, timeout=LONG)).release(50)
        assert fq.tenant_service(1) == 20 * 200
        slot = await fq.acquire(2, 50, 1, [1], 100, timeout=LONG)  # nobody waits: immediate
        assert fq.tenant_service(2) == 20 * 200 + 100  # lifted, then charged its prompt
        slot.release(0)

    run(scenario)


def test_release_charges_output_and_corrects_the_prompt_estimate():
    async def scenario():
        fq = FairQueue(output_weight=2)
        fq.replica_set(1, max_inflight=2)
        slot = await fq.acquire(1, 50, 4, [1], 100, timeout=LONG)
        assert slot.queued_seconds == 0
        assert fq.tenant_service(1) == 100 / 4  # the estimate, at dispatch
        slot.release(output_tokens=30, input_tokens=80)
        assert fq.tenant_service(1) == (80 + 2 * 30) / 4
        slot.release(output_tokens=30, input_tokens=80)  # twice: harmless
        assert fq.tenant_service(1) == (80 + 2 * 30) / 4
        assert fq.outstanding_by_replica() == {1: 0}
        unused = await fq.acquire(1, 50, 4, [1], 100, timeout=LONG)
        unused.release(output_tokens=0, input_tokens=0)  # never reached the replica
        assert fq.tenant_service(1) == (80 + 2 * 30) / 4

    run(scenario)


def test_output_is_charged_as_it_streams():
    """A long request is charged for its output while it runs, so a freed slot
    goes to the tenant that has had less, not the one whose requests are
    still running."""

    async def scenario():
        fq = FairQueue(output_weight=2, headroom=0)
        fq.replica_set(1, max_inflight=2)
        long = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        short = await fq.acquire(2, 50, 1, [1], 10, timeout=LONG)
        long.progress(100)
        long.progress(60)  # usage never goes back: ignored
        assert fq.tenant_service(1) == 10 + 2 * 100
        waiting = [asyncio.create_task(fq.acquire(t, 50, 1, [1], 10, timeout=LONG)) for t in (2, 1)]
        await asyncio.sleep(0)
        short.release(output_tokens=5, input_tokens=10)
        assert (fq.tenant_depth(1), fq.tenant_depth(2)) == (1, 0)  # tenant 2 had less
        long.release(output_tokens=120, input_tokens=10)  # the rest of its output
        assert fq.tenant_service(1) == 10 + 2 * 120 + 10
        for task in waiting:
            (await task).release()

    run(scenario)


def test_headroom_keeps_slots_for_another_tenants_first_request():
    async def scenario():
        fq = FairQueue(headroom=1 / 16)
        fq.replica_set(1, max_inflight=32)
        fq.replica_set(2, max_inflight=32)  # tenant 1's own
        assert fq.tenant_limit(1) == 30
        flood = [await fq.acquire(1, 50, 1, [1], 10, timeout=LONG) for _ in range(30)]
        more = asyncio.create_task(fq.acquire(1, 50, 1, [1], 10, timeout=LONG))
        await asyncio.sleep(0)
        assert not more.done()  # two slots free, kept for others
        assert fq.outstanding_by_replica()[1] == 30
        light = fq.acquire_nowait(2, 50, 1, [1], 10)
        assert light is not None and light.replica_id == 1  # at once
        light.release()
        flood.pop().release()  # tenant 1 back under its limit: its waiter goes
        assert (await more).replica_id == 1
        # on its own replica a tenant may take every slot
        own = [fq.acquire_nowait(1, 50, 1, [2], 10, own=[2]) for _ in range(32)]
        assert all(slot is not None for slot in own)
        assert fq.acquire_nowait(3, 50, 1, [2], 10) is None
        # fewer slots than 1/headroom: no headroom
        fq.replica_set(3, max_inflight=8)
        assert fq.tenant_limit(3) == 8

    run(scenario)


def test_overflow_admits_a_tenant_under_its_share_past_a_found_n():
    """A replica whose N (6, found at its knee) is under its ceiling (16,
    max_num_seqs): the flood holds all 6 (no headroom at 6), and a tenant
    holding less than its share starts at once past N, by at most
    ceil(6 / 4) = 2; the flood itself never gets an overflow slot."""

    async def scenario():
        fq = FairQueue(headroom=1 / 16, overflow=1 / 4)
        fq.replica_set(1, max_inflight=6, ceiling=16)
        flood = [fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(6)]
        assert all(flood)
        more = asyncio.create_task(fq.acquire(1, 50, 1, [1], 10, timeout=LONG))
        await asyncio.sleep(0)
        assert not more.done()  # alone, the flood's share is all of N and no more
        light = [fq.acquire_nowait(2, 50, 1, [1], 10) for _ in range(2)]
        assert all(light) and fq.outstanding_by_replica()[1] == 8
        assert fq.acquire_nowait(2, 50, 1, [1], 10) is None  # the overflow is 2
        third = asyncio.create_task(fq.acquire(2, 50, 1, [1], 10, timeout=LONG))
        await asyncio.sleep(0)
        light.pop().release()  # an overflow slot frees: the light waiter, not the flood
        assert (await third).tenant_id == 2
        assert not more.done()
        for slot in flood[:3]:  # 8 -> 5 outstanding: under N, the flood's waiter goes
            slot.release()
        assert (await more).tenant_id == 1
        assert fq.outstanding_by_replica()[1] == 6

    run(scenario)


def test_overflow_is_counted_apart_from_n_while_a_lowered_n_drains():
    async def scenario():
        fq = FairQueue(headroom=0, overflow=1 / 4)
        fq.replica_set(1, max_inflight=8, ceiling=16)
        flood = [fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(8)]
        fq.replica_set(1, max_inflight=4, ceiling=16)  # the replica slowed: N found lower
        light = fq.acquire_nowait(2, 50, 1, [1], 10)
        assert light is not None and light.overflow  # at once, though 8 > N run
        assert fq.acquire_nowait(2, 50, 1, [1], 10) is None  # ceil(4 / 4) = 1 past N
        light.release()
        for slot in flood:
            slot.release()
        assert fq.outstanding_by_replica()[1] == 0 and not fq._overflowed

    run(scenario)


def test_no_overflow_at_a_fixed_n_or_with_overflow_off():
    async def scenario():
        for fq, ceiling in ((FairQueue(overflow=1 / 4), None), (FairQueue(overflow=0), 16)):
            fq.replica_set(1, max_inflight=6, ceiling=ceiling)
            assert all(fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(6))
            assert fq.acquire_nowait(2, 50, 1, [1], 10) is None  # waits for one of the 6

    run(scenario)


def test_overflow_never_passes_the_ceiling():
    async def scenario():
        fq = FairQueue(headroom=0, overflow=1 / 2)
        fq.replica_set(1, max_inflight=8, ceiling=9)  # ceil(8 / 2) = 4, but 9 at most
        assert all(fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(8))
        assert fq.acquire_nowait(2, 50, 1, [1], 10) is not None
        assert fq.acquire_nowait(3, 50, 1, [1], 10) is None
        assert fq.outstanding_by_replica()[1] == 9

    run(scenario)


def test_overflow_peaks_are_the_most_held_at_once_since_last_asked():
    async def scenario():
        fq = FairQueue(headroom=0, overflow=1 / 2)
        fq.replica_set(1, max_inflight=8, ceiling=16)
        assert all(fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(8))
        light = [fq.acquire_nowait(2, 50, 1, [1], 10) for _ in range(3)]
        assert all(s.overflow for s in light)
        light.pop().release()
        light.pop().release()
        assert fq.overflow_peaks_take() == {1: 3}  # 3 at once, though 1 is held now
        assert fq.overflow_peaks_take() == {1: 1}  # since then: the one still held
        light.pop().release()
        assert fq.overflow_peaks_take() == {1: 1}  # held when last asked
        assert fq.overflow_peaks_take() == {}

    run(scenario)


def test_overflow_wanted_past_the_ceiling_counts_in_the_peak():
    """Every seat to the ceiling held and a tenant under its share waits:
    the peak says one more than held was wanted (so the reserve above N
    can grow to it); a flood's own waiter past the ceiling says nothing."""

    async def scenario():
        fq = FairQueue(headroom=0, overflow=1 / 2)
        fq.replica_set(1, max_inflight=8, ceiling=10)
        heavy = [fq.acquire_nowait(1, 50, 1, [1], 10) for _ in range(8)]
        light = [fq.acquire_nowait(2, 50, 1, [1], 10) for _ in range(2)]
        assert all(heavy) and all(s.overflow for s in light)
        assert fq.overflow_peaks_take() == {1: 2}
        flood = asyncio.ensure_future(fq.acquire(1, 50, 1, [1], 10, timeout=5))
        await asyncio.sleep(0)
        assert fq.overflow_peaks_take() == {1: 2}  # the flood is over its share: no want
        third = asyncio.ensure_future(fq.acquire(2, 50, 1, [1], 10, timeout=5))
        await asyncio.sleep(0)
        assert not third.done()  # full to the ceiling: it waits
        assert fq.overflow_peaks_take() == {1: 3}
        heavy.pop().release()  # an overflow seat again: the tenant under its share has it
        await asyncio.sleep(0)
        assert third.done() and third.result().overflow and not flood.done()
        flood.cancel()
        await asyncio.sleep(0)

    run(scenario)


# --- priority classes --------------------------------------------------------


def test_higher_class_first_with_a_starvation_bound():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT, starvation_passes=3)
        bench = Backlog(fq, slots=1)
        bench.tenant_start(2, Load(prompt=10, output=10, priority=100))  # batch, first in
        await bench.settle()
        bench.tenant_start(1, Load(prompt=10, output=10, priority=0))  # critical
        await bench.settle()
        await bench.complete(402)
        await bench.close()
        order = bench.order[2:]
        # batch gets exactly every fourth slot: passed over 3 times, never more
        runs, current = [], 0
        for tenant in order:
            if tenant == 1:
                current += 1
            else:
                runs.append(current)
                current = 0
        assert set(runs[1:]) == {3}, runs
        assert Counter(order)[2] == pytest.approx(len(order) / 4, abs=2)

    run(scenario)


def test_strict_class_order_below_the_bound():
    async def scenario():
        fq = FairQueue(starvation_passes=100)
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(9, 50, 1, [1], 1, timeout=LONG)
        batch = asyncio.create_task(fq.acquire(2, 100, 1, [1], 1, timeout=LONG))
        await asyncio.sleep(0)
        normal = asyncio.create_task(fq.acquire(3, 50, 1, [1], 1, timeout=LONG))
        await asyncio.sleep(0)
        critical = asyncio.create_task(fq.acquire(4, 0, 1, [1], 1, timeout=LONG))
        await asyncio.sleep(0)
        assert fq.depth_by_priority() == {100: 1, 50: 1, 0: 1}
        served = []
        slot = busy
        for task in (critical, normal, batch):
            slot.release()
            slot = await task
            served.append(slot.tenant_id)
        slot.release()
        assert served == [4, 3, 2]
        assert fq.depth_by_priority() == {}

    run(scenario)


def test_several_starved_classes_each_get_their_turn():
    async def scenario():
        fq = FairQueue(output_weight=W_OUT, starvation_passes=4)
        bench = Backlog(fq, slots=1)
        bench.tenant_start(3, Load(prompt=10, output=10, priority=100))
        bench.tenant_start(2, Load(prompt=10, output=10, priority=50))
        bench.tenant_start(1, Load(prompt=10, output=10, priority=0))
        await bench.settle()
        await bench.complete(300)
        await bench.close()
        order = bench.order[10:]
        for tenant in (2, 3):
            gaps, last = [], None
            for i, t in enumerate(order):
                if t == tenant:
                    if last is not None:
                        gaps.append(i - last - 1)
                    last = i
            # passed over at most K + C - 2 = 4 + 3 - 2 times in a row
            assert gaps and max(gaps) <= 5, (tenant, gaps)

    run(scenario)


# --- leaving the queue -----------------------------------------------------


def test_queue_timeout_raises_with_the_seconds_waited():
    async def scenario():
        fq = FairQueue()
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        with pytest.raises(QueueTimeout) as raised:
            await fq.acquire(2, 50, 1, [1], 10, timeout=0.02)
        assert 0.019 <= raised.value.waited_seconds < 1
        assert raised.value.timeout_seconds == 0.02
        assert "timeout 0.02s" in str(raised.value)
        assert fq.tenant_depth(2) == 0 and fq.depth_by_priority() == {}
        # lifted to the level of the last tenant served on joining, charged nothing
        assert fq.tenant_service(2) == fq.tenant_service(1) == 10
        with pytest.raises(QueueTimeout) as raised:
            await fq.acquire(2, 50, 1, [1], 10, timeout=0)  # no waiting at all
        assert raised.value.waited_seconds == 0
        busy.release()
        assert fq.outstanding_by_replica() == {1: 0}

    run(scenario)


def test_queue_bound_refuses_at_once():
    async def scenario():
        fq = FairQueue(default_max_queued=3)
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        waiting = [
            asyncio.create_task(fq.acquire(2, 50, 1, [1], 10, timeout=LONG, max_queued=2))
            for _ in range(2)
        ]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as raised:
            await fq.acquire(2, 50, 1, [1], 10, timeout=LONG, max_queued=2)
        assert raised.value.bound == 2
        assert "bound 2" in str(raised.value)
        assert fq.tenant_depth(2) == 2
        # the default bound, and per tenant: another tenant still queues
        others = [
            asyncio.create_task(fq.acquire(3, 50, 1, [1], 10, timeout=LONG)) for _ in range(3)
        ]
        await asyncio.sleep(0)
        with pytest.raises(QueueFull) as raised:
            await fq.acquire(3, 50, 1, [1], 10, timeout=LONG)
        assert raised.value.bound == 3
        for task in waiting + others:
            task.cancel()
        await asyncio.gather(*waiting, *others, return_exceptions=True)
        busy.release()
        assert fq.depth_by_priority() == {}

    run(scenario)


def test_a_full_tenant_queue_does_not_refuse_when_a_slot_is_free():
    async def scenario():
        fq = FairQueue()
        fq.replica_set(1, max_inflight=1)
        fq.replica_set(2, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        slot = await fq.acquire(1, 50, 1, [1, 2], 10, timeout=LONG, max_queued=0)
        assert slot.replica_id == 2
        with pytest.raises(QueueFull):
            await fq.acquire(1, 50, 1, [1, 2], 10, timeout=LONG, max_queued=0)
        busy.release()
        slot.release()

    run(scenario)


def test_a_cancelled_waiter_leaves_no_slot_and_no_charge():
    async def scenario():
        fq = FairQueue()
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        task = asyncio.create_task(fq.acquire(2, 50, 1, [1], 500, timeout=LONG))
        await asyncio.sleep(0)
        assert fq.tenant_depth(2) == 1
        charged = fq.tenant_service(2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert fq.tenant_depth(2) == 0 and fq.depth_by_priority() == {}
        busy.release()
        assert fq.outstanding_by_replica() == {1: 0}
        assert fq.tenant_service(2) == charged

    run(scenario)


def test_a_waiter_cancelled_after_its_grant_gives_the_slot_back():
    """The slot is granted when the holder releases; the client disconnects
    before the waiting task runs again."""

    async def scenario():
        fq = FairQueue()
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        gone = asyncio.create_task(fq.acquire(2, 50, 1, [1], 500, timeout=LONG))
        next_in_line = asyncio.create_task(fq.acquire(3, 50, 1, [1], 10, timeout=LONG))
        await asyncio.sleep(0)
        charged = fq.tenant_service(2)
        busy.release()  # grants tenant 2 (earlier, equal counters)
        assert fq.tenant_service(2) == charged + 500
        gone.cancel()
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert fq.tenant_service(2) == charged
        slot = await next_in_line  # the returned slot went on to the next waiter
        assert slot.tenant_id == 3
        assert fq.outstanding_by_replica() == {1: 1}
        slot.release()
        assert fq.outstanding_by_replica() == {1: 0}

    run(scenario)


def test_queued_seconds_and_gauges():
    async def scenario():
        fq = FairQueue()
        fq.replica_set(1, max_inflight=1)
        busy = await fq.acquire(1, 50, 1, [1], 10, timeout=LONG)
        task = asyncio.create_task(fq.acquire(2, 100, 1, [1], 10, timeout=LONG))
        await asyncio.sleep(0.01)
        assert fq.depth_by_priority() == {100: 1}
        assert fq.outstanding_by_replica() == {1: 1}
        busy.release()
        slot = await task
        assert slot.queued_seconds >= 0.009
        assert fq.depth_by_priority() == {}
        slot.release()

    run(scenario)


# --- replicas ----------------------------------------------------------------


def test_owner_first_on_its_dedicated_replica_with_spill_into_shared():
    dedicated, shared = 10, 20
    owner, other = 1, 2

    async def scenario():
        fq = FairQueue()
        fq.replicas_sync({dedicated: 1, shared: 1})

        def owner_acquire(priority: int = 100):
            return fq.acquire(
                owner, priority, 1, [dedicated, shared], 10, timeout=LONG, own={dedicated}
            )

        def other_acquire(priority: int = 50):
            # lent idle dedicated capacity: the other tenant may spill onto it
            return fq.acquire(other, priority, 1, [shared, dedicated], 10, timeout=LONG)

        first = await owner_acquire()
        spilled = await owner_acquire()
        assert (first.replica_id, first.own) == (dedicated, True)
        assert (spilled.replica_id, spilled.own) == (shared, False)
        assert fq.tenant_service(owner) == 10  # only the shared slot is charged

        early = asyncio.create_task(other_acquire(priority=0))  # earlier, higher class
        await asyncio.sleep(0)
        late = asyncio.create_task(owner_acquire())
        await asyncio.sleep(0)
        first.release()  # a dedicated slot frees: its owner comes first
        slot = await late
        assert (slot.tenant_id, slot.replica_id) == (owner, dedicated)
        spilled.release()  # the shared slot: the other tenant
        other_slot = await early
        assert other_slot.replica_id == shared

        # both spill into the shared pool: the shared fair queue, least counter first
        owner_wait = asyncio.create_task(owner_acquire(priority=50))
        await asyncio.sleep(0)
        other_wait = asyncio.create_task(other_acquire())
        await asyncio.sleep(0)
        other_slot.release(output_tokens=100)  # charged: the other tenant is now ahead
        got = await owner_wait
        assert (got.tenant_id, got.replica_id) == (owner, shared)
        slot.release()  # dedicated frees, only the other tenant waits: lent out
        lent = await other_wait
        assert (lent.replica_id, lent.own) == (dedicated, False)
        got.release()
        lent.release()
        assert fq.outstanding_by_replica() == {dedicated: 0, shared: 0}

    run(scenario)


def test_replica_updates_dispatch_waiters():
    async def scenario():
        fq = FairQueue()
        fq.replicas_sync({1: 1})
        busy = await fq.acquire(1, 50, 1, [1, 2], 10, timeout=LONG)
        task = asyncio.create_task(fq.acquire(2, 50, 1, [1, 2], 10, timeout=LONG))
        await asyncio.sleep(0)
        fq.replicas_sync({1: 1, 2: 1})  # a new replica: the waiter takes it
        slot = await task
        assert slot.replica_id == 2
        fq.replicas_sync({2: 1})  # replica 1 leaves while a slot is out
        assert fq.outstanding_by_replica() == {1: 1, 2: 1}
        busy.release()
        assert fq.outstanding_by_replica() == {2: 1}
        third = asyncio.create_task(fq.acquire(3, 50, 1, [2], 10, timeout=LONG))
        await asyncio.sleep(0)
        fq.replica_set(2, max_inflight=2)  # more room
        third_slot = await third
        assert third_slot.replica_id == 2
        slot.release()
        third_slot.release()
        assert fq.outstanding_by_replica() == {2: 0}

    run(scenario)


@dataclass(frozen=True)
class Op:
    tenant: int
    priority: int
    candidates: tuple[int, ...]
    delay: int  # yields before acquiring
    hold: int  # yields holding the slot
    timeout: float
    cancel_after: int | None  # yields before the client disconnects


ops = st.builds(
    Op,
    tenant=st.integers(1, 4),
    priority=st.sampled_from([0, 50, 100]),
    candidates=st.lists(st.integers(1, 3), min_size=1, max_size=3, unique=True).map(tuple),
    delay=st.integers(0, 5),
    hold=st.integers(0, 5),
    timeout=st.sampled_from([0.0, 0.002, LONG, LONG]),
    cancel_after=st.none() | st.integers(0, 8),
)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.fixed_dictionaries(
        {1: st.integers(1, 3), 2: st.integers(1, 2), 3: st.integers(1, 2)}
    ),
    ops=st.lists(ops, min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
    headroom=st.sampled_from([0.0, 0.34, 0.5]),
)
def test_max_inflight_is_never_exceeded(capacity, ops, seed, headroom):
    """Nor a tenant's limit on a replica not its own; and nobody waits for a
    replica with room they may use."""
    rng = random.Random(seed)

    async def scenario():
        fq = FairQueue(starvation_passes=2, default_max_queued=5, headroom=headroom)
        fq.replicas_sync(capacity)
        held: Counter = Counter()
        shared_held: Counter = Counter()  # (replica, tenant) on replicas not its own
        violations: list[str] = []

        def check() -> None:
            for replica_id, n in fq.outstanding_by_replica().items():
                if n > capacity[replica_id]:
                    violations.append(f"replica {replica_id}: {n} > {capacity[replica_id]}")
            for replica_id, n in held.items():
                if n > fq.outstanding_by_replica().get(replica_id, 0):
                    violations.append(f"replica {replica_id}: held {n} not counted")
            for (replica_id, tenant), n in shared_held.items():
                if n > fq.tenant_limit(replica_id):
                    violations.append(f"tenant {tenant} holds {n} of replica {replica_id}")
            # work-conserving: nobody waits for a replica with room they may use
            for replica_id, tiers in fq._index.items():
                if fq.outstanding_by_replica().get(replica_id, 0) < capacity[replica_id]:
                    live = [
                        waiter
                        for tier, classes in tiers.items()
                        for flows in classes.values()
                        for tenant, fifo in flows.items()
                        for waiter in fifo.values()
                        if not waiter.future.done()
                        and (
                            tier == 0
                            # The queue's own count: a slot granted to a
                            # task that has not resumed yet is held already.
                            or fq._held.get((replica_id, tenant), 0) < fq.tenant_limit(replica_id)
                        )
                    ]
                    if live:
                        violations.append(f"replica {replica_id} has room, {len(live)} wait")

        async def client(op: Op) -> None:
            for _ in range(op.delay):
                await asyncio.sleep(0)
            try:
                slot = await fq.acquire(
                    op.tenant,
                    op.priority,
                    rng.choice([1, 2]),
                    op.candidates,
                    rng.randint(1, 50),
                    timeout=op.timeout,
                    own=[c for c in op.candidates if c == op.tenant],
                )
            except (QueueTimeout, QueueFull):
                return
            held[slot.replica_id] += 1
            if not slot.own:
                shared_held[slot.replica_id, op.tenant] += 1
            check()
            try:
                for _ in range(op.hold):
                    await asyncio.sleep(0)
                    check()
            finally:
                held[slot.replica_id] -= 1
                if not slot.own:
                    shared_held[slot.replica_id, op.tenant] -= 1
                slot.release(output_tokens=rng.randint(0, 20))
                if rng.random() < 0.3:
                    slot.release()

        async def disconnect(task: asyncio.Task, after: int) -> None:
            for _ in range(after):
                await asyncio.sleep(0)
            task.cancel()

        tasks = [asyncio.create_task(client(op)) for op in ops]
        cancels = [
            asyncio.create_task(disconnect(task, op.cancel_after))
            for task, op in zip(tasks, ops, strict=True)
            if op.cancel_after is not None
        ]
        await asyncio.wait_for(asyncio.gather(*tasks, *cancels, return_exceptions=True), 10)
        assert violations == []
        assert all(n == 0 for n in fq.outstanding_by_replica().values())
        assert fq.depth_by_priority() == {}
        assert fq._index == {} and fq._waiting == {}

    run(scenario)


@settings(max_examples=60, deadline=None)
@given(
    capacity=st.integers(1, 6),
    above=st.integers(0, 4),  # the ceiling: N + above
    lowered=st.integers(1, 5),  # N lowered to this partway (a found N moving), if below
    ops=st.lists(ops, min_size=1, max_size=40),
    seed=st.integers(0, 2**16),
)
def test_overflow_never_passes_its_bounds_and_goes_only_to_a_tenant_under_its_share(
    capacity, above, lowered, ops, seed
):
    """One shared replica with a found N below its ceiling: never more than
    the ceiling outstanding, never more than ceil(N / 4) overflow slots held,
    each granted to a tenant holding less than its even share at the time,
    and everything given back in the end."""
    rng = random.Random(seed)

    async def scenario():
        fq = FairQueue(starvation_passes=2, default_max_queued=5, headroom=0, overflow=1 / 4)
        fq.replica_set(1, max_inflight=capacity, ceiling=capacity + above)
        violations: list[str] = []

        def check() -> None:
            n = fq._capacity[1]
            if fq.outstanding_by_replica().get(1, 0) > capacity + above:
                violations.append(f"{fq.outstanding_by_replica()} past the ceiling")
            if fq._overflowed.get(1, 0) > max(math.ceil(capacity / 4), math.ceil(n / 4)):
                violations.append(f"{fq._overflowed} overflow slots")

        async def client(op: Op, i: int) -> None:
            for _ in range(op.delay):
                await asyncio.sleep(0)
            if i == len(ops) // 2 and lowered < capacity:
                fq.replica_set(1, max_inflight=lowered, ceiling=capacity + above)
            holders = fq._holders.get(1, 0)
            share_before = fq._held.get((1, op.tenant), 0)
            try:
                slot = await fq.acquire(
                    op.tenant, op.priority, 1, [1], rng.randint(1, 50), timeout=op.timeout
                )
            except (QueueTimeout, QueueFull):
                return
            if slot.overflow and slot.queued_seconds == 0.0:
                counted = holders + (0 if share_before else 1)
                if share_before * counted >= fq._capacity[1]:
                    violations.append(f"tenant {op.tenant} at its share got an overflow slot")
            check()
            try:
                for _ in range(op.hold):
                    await asyncio.sleep(0)
                    check()
            finally:
                slot.release(output_tokens=rng.randint(0, 20))

        tasks = [asyncio.create_task(client(op, i)) for i, op in enumerate(ops)]
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
        assert violations == []
        assert fq.outstanding_by_replica().get(1, 0) == 0
        assert fq._overflowed == {} and fq._holders == {} and fq._waiting == {}

    run(scenario)
