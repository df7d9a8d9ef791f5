"""Fair queuing at the gateway: flow control per replica and weighted fair
sharing across tenants, in one process (pure asyncio, no I/O).

Flow control. Each replica takes at most `max_inflight` requests from this
gateway at a time (`replica_set`); the rest wait here, in per-tenant FIFO
queues, instead of in vLLM's first-come-first-served queue.

Headroom. On a replica that is not its own, no one tenant holds more than
`max_inflight - floor(max_inflight * headroom)` slots (headroom 1/16: 60 of
64). The last slots stay free for another tenant's first requests, which
then start at once instead of waiting for one of a flood's long requests to
end: without them a tenant that starts sending while another fills the
replica waits, at every arrival, for the next completion (hundreds of
milliseconds on vLLM-CPU). A replica with fewer than 1/headroom slots keeps
none. The cost is the headroom itself while one tenant is alone: measured
by bench/fairness.py.

Overflow. A replica whose N the gateway finds (adaptive concurrency, at the
knee of its step time) may take more than N: up to its configured
`max_inflight` (its ceiling; for vLLM, max_num_seqs). A tenant holding less
than its even share of N there (N over the tenants holding slots, itself
counted) is admitted past N, by at most ceil(N x overflow) requests
(`overflow`, 1/4, counted apart from N: they start even while a lowered N
drains) when all N are taken: on a memory-bound engine one more
sequence barely lengthens a step, while waiting for a flood's request to end
costs the newcomer seconds. Headroom cannot do this at a small N (6 slots
keep none), and no tenant above its share ever gets an overflow slot, so a
flood stays at N. A replica with a fixed N (its ceiling) has no overflow.

Fairness: a virtual token counter per tenant (VTC: Sheng et al., "Fairness in
Serving Large Language Models", OSDI 2024). A request's service is
`input_tokens + output_weight * output_tokens`, divided by the tenant's
weight. The prompt estimate is charged at dispatch, output as it streams
(`Slot.progress`, as the paper counts each generated token), and at release
the rest of the output and the estimate corrected to the actual input.
Charging output only at release would let a tenant of long requests look
cheap for as long as they run and take the freed slots meanwhile (measured:
48% apart instead of within 10%). When a slot frees on a replica, the head
request of the backlogged tenant with the least counter, among tenants with
a request that may run there and room under the headroom, goes next.

`output_weight` defaults to 2, the weight the paper evaluates with. An
output token costs the replica more than a prompt token: each takes a
decode step of its own and keeps its KV cache for the rest of the request,
while prompt tokens go through prefill many at a time. Output is also priced
above input by every major API, so a tenant's share follows what it pays
for. 2 is a setting, not a measurement: where a replica's decode and prefill
costs per token are known, derive it from them.

No hoarded credit: a tenant that becomes backlogged has its counter lifted to
the least counter among the backlogged tenants (to the counter of the tenant
that last left the backlog when nobody is backlogged, as in the paper's
algorithm; an immediate dispatch counts as joining and leaving at once).
Service a tenant got while nobody else waited is therefore never held
against it: newcomers start from its level. Only service on replicas that
are not the tenant's own is charged: dedicated and reserved capacity is paid
for separately, and spill into the shared pool joins the shared fair queue
on equal terms.

Order on a freed slot of replica r, first rule first:
  1. requests for which r is their own (dedicated/reserved) replica, before
     spill-over from others;
  2. priority class, lower value first (vLLM's convention, `Caller.priority`:
     critical 0 ... batch 100), with a starvation bound: a class with a request
     that may run on r is passed over at most `starvation_passes` times in a
     row (K); the next slot it may use is its own. With C classes waiting at
     once the bound is K + C - 2 (starved classes go most-passed first). A
     count, not an age: it guarantees a waiting lower class at least one
     dispatch in K + 1 without ever handing a sustained overload of batch
     traffic the whole replica, as an age-based boost would;
  3. least VTC counter among tenants under the headroom limit there, ties
     to the earlier request;
  4. FIFO within a tenant.
Each dispatch costs O(priority classes + tenants waiting on that replica).
A new request is dispatched at once when one of its candidates has a free
slot: the queue is work-conserving, so a free slot means nobody who could
use it is waiting. Candidates are tried in the order given (own first, then
shared; within a group the caller orders by load).

Memory is bounded by the per-tenant queue bound (`max_queued`, refused with
QueueFull) times the tenants, plus one counter per tenant seen. A waiter
that times out (QueueTimeout) or whose task is cancelled (client gone)
leaves at once, uncharged; a slot granted to a task cancelled before it ran
is returned and its charge undone.

Unbounded (`FairQueue(unbounded=True)`, fair queuing off): every replica
takes every request at once, as vLLM queues what it cannot batch. A slot
is granted on the first candidate with nothing counted and nothing to give
back: the gateway's one request path runs through the queue either way, at
the cost of one small object per attempt.

Scope: one event loop, one process, no I/O. Across gateway processes,
gateway/fairness_redis.py shares the counters (`service_drain`,
`service_merge`) and each replica's slots (`replica_set` with this
process's share, from `waiting_by_replica` and `outstanding_by_replica`)
through Redis."""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

OUTPUT_WEIGHT = 2
HEADROOM = 1 / 16
OVERFLOW = 1 / 4
STARVATION_PASSES = 8
DEFAULT_MAX_QUEUED = 100

_OWN, _SPILL = 0, 1  # tiers of a waiter on one of its candidate replicas


class QueueRefused(Exception):
    """A request that waited in (or could not join) the gateway's queue."""


class QueueTimeout(QueueRefused):
    def __init__(self, waited_seconds: float, timeout_seconds: float) -> None:  # ok-float
        super().__init__(
            f"waited {waited_seconds:.3f}s in the gateway queue (timeout {timeout_seconds:g}s)"
        )
        self.waited_seconds = waited_seconds
        self.timeout_seconds = timeout_seconds


class QueueFull(QueueRefused):
    def __init__(self, bound: int) -> None:
        super().__init__(f"the tenant's gateway queue is full (bound {bound})")
        self.bound = bound


@dataclass(slots=True, eq=False)
class _Waiter:
    """A request waiting for a slot on one of its candidate replicas."""

    tenant_id: int
    priority: int
    weight: float  # ok-float: a share, not money
    candidates: tuple[int, ...]
    own: frozenset[int]
    prompt_tokens: int
    seq: int
    enqueued_at: float  # ok-float: monotonic seconds
    future: asyncio.Future[Slot]
    queued: bool = False


class Slot:
    """One request's place on a replica, from dispatch to `release`."""

    __slots__ = (
        "_charged_output",
        "_queue",
        "_released",
        "overflow",
        "own",
        "priority",
        "prompt_tokens",
        "queued_seconds",
        "replica_id",
        "tenant_id",
        "weight",
    )

    def __init__(
        self,
        queue: FairQueue | None,
        *,
        replica_id: int,
        tenant_id: int,
        priority: int,
        weight: float,  # ok-float
        own: bool,
        prompt_tokens: int,
        queued_seconds: float,  # ok-float
        overflow: bool = False,
    ) -> None:
        self._queue = queue
        self.overflow = overflow  # granted past N
        self._released = False
        self._charged_output = 0
        self.replica_id = replica_id
        self.tenant_id = tenant_id
        self.priority = priority
        self.weight = weight
        self.own = own
        self.prompt_tokens = prompt_tokens
        self.queued_seconds = queued_seconds

    @property
    def released(self) -> bool:
        return self._released

    @property
    def output_counter(self) -> Callable[[int], None] | None:
        """What to tell the output as it streams (`progress`); None for a
        slot of an unbounded queue, which counts nothing (a stream then
        skips reading its usage on every chunk)."""
        return None if self._queue is None else self.progress

    def progress(self, output_tokens: int) -> None:
        """Charge the output generated so far (`output_tokens` in all, as the
        stream's usage counts them); the slot stays held."""
        if self._released or output_tokens <= self._charged_output:
            return
        added = output_tokens - self._charged_output
        self._charged_output = output_tokens
        if not self.own:
            self._queue._charge(self.tenant_id, self._queue.output_weight * added / self.weight)

    def release(self, output_tokens: int = 0, input_tokens: int | None = None) -> None:
        """Free the slot and charge the actual service: `output_tokens` in all
        (less what `progress` charged) and the difference between
        `input_tokens` (when known) and the prompt estimate charged at
        dispatch. A request that never reached the replica releases with
        input_tokens=0. Releasing again does nothing."""
        if self._released:
            return
        self._released = True
        if self._queue is None:  # an unbounded queue's: nothing held
            return
        correction = 0 if input_tokens is None else input_tokens - self.prompt_tokens
        output = output_tokens - self._charged_output
        self._queue._slot_release(self, self._queue.output_weight * output + correction)

    def _revoke(self) -> None:
        """Give back a slot its task never used: free it, undo the dispatch charge."""
        if self._released:
            return
        self._released = True
        self._queue._slot_release(self, -self.prompt_tokens)


class FairQueue:
    """One per gateway process. Register replicas with `replica_set` (or
    `replicas_sync` from a fleet snapshot), then `await acquire(...)` before
    calling a replica and `slot.release(...)` after."""

    def __init__(
        self,
        *,
        output_weight: float = OUTPUT_WEIGHT,  # ok-float
        starvation_passes: int = STARVATION_PASSES,
        default_max_queued: int = DEFAULT_MAX_QUEUED,
        headroom: float = HEADROOM,  # ok-float: a share of a replica's slots
        overflow: float = OVERFLOW,  # ok-float: a share of a replica's N
        clock: Callable[[], float] = time.monotonic,
        track_service: bool = False,
        unbounded: bool = False,
    ) -> None:
        """`track_service`: keep the counter changes since the last
        `service_drain`, for sharing them with other processes.
        `unbounded`: no replica's slots run out (fair queuing off)."""
        if not 0 <= headroom < 1:
            raise ValueError("headroom must be in [0, 1)")
        if overflow < 0:
            raise ValueError("overflow must be >= 0")
        self.unbounded = unbounded
        self.overflow = overflow
        self.output_weight = output_weight
        self.headroom = headroom
        self.starvation_passes = starvation_passes
        self.default_max_queued = default_max_queued
        self._clock = clock
        self._capacity: dict[int, int] = {}  # replica -> max_inflight (N)
        self._ceiling: dict[int, int] = {}  # replica -> the most it may take (>= N)
        self._outstanding: dict[int, int] = {}  # replica -> slots granted, not released
        # (replica, tenant) -> slots held there that are not the tenant's own
        self._held: dict[tuple[int, int], int] = {}
        self._holders: dict[int, int] = {}  # replica -> tenants holding such slots
        self._overflowed: dict[int, int] = {}  # replica -> slots granted past N, held
        self._overflow_peak: dict[int, int] = {}  # ... the most held since last asked
        self._counters: dict[int, float] = {}  # tenant -> weighted service  # ok-float
        self._waiting: dict[int, int] = {}  # backlogged tenant -> requests waiting
        self._depth: dict[int, int] = {}  # priority class -> requests waiting
        self._passed: dict[int, int] = {}  # priority class -> passed over in a row
        self._last_left: int | None = None
        # replica -> tier -> priority -> tenant -> seq -> waiter (FIFO by seq)
        self._index: dict[int, dict[int, dict[int, dict[int, OrderedDict[int, _Waiter]]]]] = {}
        self._waiting_at: dict[int, int] = {}  # replica -> waiters it is a candidate of
        self._seq = itertools.count()
        self._track = track_service
        # Since the last drain, per tenant: the floor lifts (net of the
        # charges before them) and the charges: shared = max(shared, floor) + delta.
        self._floors: dict[int, float] = {}  # ok-float
        self._deltas: dict[int, float] = {}  # ok-float

    # --- replicas ------------------------------------------------------------
    def replica_set(
        self, replica_id: int, *, max_inflight: int, ceiling: int | None = None
    ) -> None:
        """Register a replica or change its limit (N, and the most it may take
        with overflow: N when None); waiters fill new room at once."""
        if max_inflight < 0:
            raise ValueError("max_inflight must be >= 0")
        self._capacity[replica_id] = max_inflight
        self._ceiling[replica_id] = max(max_inflight, ceiling or 0)
        self._dispatch(replica_id)

    def replica_remove(self, replica_id: int) -> None:
        """No more dispatches to it. Its slots still release normally; waiters
        with no other candidate wait on (until it returns, or they time out)."""
        self._capacity.pop(replica_id, None)
        self._ceiling.pop(replica_id, None)
        if not self._outstanding.get(replica_id):
            self._outstanding.pop(replica_id, None)

    def replicas_sync(
        self, max_inflight: Mapping[int, int], ceilings: Mapping[int, int] | None = None
    ) -> None:
        """Make the registered replicas exactly these (replica id -> N, and
        replica id -> its ceiling where it may take more)."""
        ceilings = ceilings or {}
        for replica_id in [r for r in self._capacity if r not in max_inflight]:
            self.replica_remove(replica_id)
        for replica_id, limit in max_inflight.items():
            ceiling = max(limit, ceilings.get(replica_id, limit))
            if (self._capacity.get(replica_id), self._ceiling.get(replica_id)) != (limit, ceiling):
                self.replica_set(replica_id, max_inflight=limit, ceiling=ceiling)

    # --- gauges --------------------------------------------------------------
    def depth_by_priority(self) -> dict[int, int]:
        """Requests waiting, per priority class."""
        return dict(self._depth)

    def slots_by_replica(self) -> dict[int, int]:
        """Each registered replica's max_inflight (this process's share)."""
        return dict(self._capacity)

    def overflow_peaks_take(self) -> dict[int, int]:
        """Per replica, the most overflow slots held at once since the last
        call, or wanted: one more than held while a tenant under its share
        waited with no room left (adaptive concurrency sizes each replica's
        reserve by it)."""
        peaks = {r: max(n, self._overflowed.get(r, 0)) for r, n in self._overflow_peak.items()}
        self._overflow_peak = {r: n for r, n in self._overflowed.items() if n}
        return peaks

    def outstanding_by_replica(self) -> dict[int, int]:
        """Slots granted and not yet released, per replica."""
        return dict(self._outstanding)

    def waiting_by_replica(self) -> dict[int, int]:
        """Requests waiting that could run on each replica (a request with
        several candidates counts at each)."""
        return dict(self._waiting_at)

    def tenant_limit(self, replica_id: int) -> int:
        """The most slots one tenant may hold on the replica when it is not
        the tenant's own: all but the headroom."""
        capacity = self._capacity.get(replica_id, 0)
        return capacity - math.floor(capacity * self.headroom)

    def tenant_depth(self, tenant_id: int) -> int:
        return self._waiting.get(tenant_id, 0)

    def tenants_waiting(self) -> list[int]:
        return list(self._waiting)

    # --- sharing counters with other processes ---------------------------------
    def service_drain(self) -> tuple[dict[int, float], dict[int, float]]:  # ok-float
        """The counter changes since the last drain, as (floors, deltas) per
        tenant: apply as `counter = max(counter, floor) + delta`."""
        floors, deltas = self._floors, self._deltas
        self._floors, self._deltas = {}, {}
        return floors, deltas

    def service_restore(
        self,
        floors: Mapping[int, float],  # ok-float
        deltas: Mapping[int, float],  # ok-float
    ) -> None:
        """Put back drained changes that could not be shared, ahead of the
        changes made since: (F1, d1) then (F2, d2) is (max(F1, F2 - d1), d1 + d2)."""
        for tenant_id in set(floors) | set(deltas):
            d1, d2 = deltas.get(tenant_id, 0.0), self._deltas.get(tenant_id, 0.0)
            candidates = [floors.get(tenant_id)]
            if tenant_id in self._floors:
                candidates.append(self._floors[tenant_id] - d1)
            known = [f for f in candidates if f is not None]
            if known:
                self._floors[tenant_id] = max(known)
            if d1 or d2:
                self._deltas[tenant_id] = d1 + d2

    def service_merge(self, shared: Mapping[int, float]) -> None:  # ok-float
        """Take the shared counters (after the drained changes were applied to
        them), keeping the changes made here since the drain."""
        for tenant_id, value in shared.items():
            floor = self._floors.get(tenant_id)
            base = value if floor is None else max(value, floor)
            self._counters[tenant_id] = base + self._deltas.get(tenant_id, 0.0)

    def _charge(self, tenant_id: int, amount: float) -> None:  # ok-float
        self._counters[tenant_id] = self._counters.get(tenant_id, 0.0) + amount
        if self._track:
            self._deltas[tenant_id] = self._deltas.get(tenant_id, 0.0) + amount

    def tenant_service(self, tenant_id: int) -> float:  # ok-float
        """The tenant's virtual counter (weighted service, lifted)."""
        return self._counters.get(tenant_id, 0.0)

    # --- requests ------------------------------------------------------------
    async def acquire(
        self,
        tenant_id: int,
        priority: int,
        weight: float,  # ok-float
        candidates: Sequence[int],
        prompt_tokens: int,
        *,
        timeout: float,  # ok-float: seconds
        own: Collection[int] = (),
        max_queued: int | None = None,
    ) -> Slot:
        """A slot on the first of `candidates` (replica ids, preference order)
        with room, at once if there is one, else when the fair order reaches
        this request. `own`: those of the candidates that are the tenant's own
        (dedicated/reserved) replicas. `max_queued`: the tenant's queue bound
        (default `default_max_queued`).

        Raises QueueFull when the tenant already has `max_queued` requests
        waiting, QueueTimeout after `timeout` seconds of waiting. Cancelling
        the awaiting task leaves the queue with nothing charged."""
        slot = self.acquire_nowait(tenant_id, priority, weight, candidates, prompt_tokens, own=own)
        if slot is not None:
            return slot
        ordered = tuple(dict.fromkeys(candidates))
        own_set = frozenset(own)
        bound = self.default_max_queued if max_queued is None else max_queued
        if self._waiting.get(tenant_id, 0) >= bound:
            raise QueueFull(bound)
        if timeout <= 0:
            raise QueueTimeout(0.0, timeout)
        loop = asyncio.get_running_loop()
        self._lift(tenant_id)
        waiter = _Waiter(
            tenant_id=tenant_id,
            priority=priority,
            weight=float(weight),  # ok-float
            candidates=ordered,
            own=own_set,
            prompt_tokens=prompt_tokens,
            seq=next(self._seq),
            enqueued_at=self._clock(),
            future=loop.create_future(),
        )
        self._enqueue(waiter)
        for replica_id in ordered:
            self._overflow_wanted(replica_id)
        expiry = loop.call_later(timeout, self._expire, waiter, timeout)
        try:
            return await waiter.future
        except asyncio.CancelledError:
            self._abandon(waiter)
            raise
        finally:
            expiry.cancel()

    def acquire_nowait(
        self,
        tenant_id: int,
        priority: int,
        weight: float,  # ok-float
        candidates: Sequence[int],
        prompt_tokens: int,
        *,
        own: Collection[int] = (),
    ) -> Slot | None:
        """A slot at once (as `acquire` would give it), or None: nothing free."""
        if weight <= 0:
            raise ValueError("weight must be > 0")
        if not candidates:
            raise ValueError("no candidate replicas")
        if self.unbounded:
            return Slot(
                None,
                replica_id=candidates[0],
                tenant_id=tenant_id,
                priority=priority,
                weight=weight,
                own=True,
                prompt_tokens=0,
                queued_seconds=0.0,
            )
        chosen = next(
            (
                r
                for r in candidates
                if self._has_room(r) and (r in own or self._under_limit(r, tenant_id))
            ),
            None,
        )
        overflow = False
        if chosen is None and tenant_id not in self._waiting:  # past N, under its share
            overflow = True
            chosen = next(
                (
                    r
                    for r in candidates
                    if r not in own and self._overflow_room(r) and self._under_served(r, tenant_id)
                ),
                None,
            )
        if chosen is None:
            return None
        self._lift(tenant_id)
        return self._grant(
            chosen,
            tenant_id=tenant_id,
            priority=priority,
            weight=float(weight),  # ok-float
            own=chosen in own,
            prompt_tokens=prompt_tokens,
            queued_seconds=0.0,
            overflow=overflow,
        )

    # --- internals -----------------------------------------------------------
    def _has_room(self, replica_id: int) -> bool:
        return self._outstanding.get(replica_id, 0) < self._capacity.get(replica_id, 0)

    def _under_limit(self, replica_id: int, tenant_id: int) -> bool:
        return self._held.get((replica_id, tenant_id), 0) < self.tenant_limit(replica_id)

    def _overflow_room(self, replica_id: int) -> bool:
        """All N taken, fewer than ceil(N x overflow) overflow slots held, and
        room under the ceiling: counted apart from N, so a tenant under its
        share still starts at once while a lowered N drains."""
        capacity = self._capacity.get(replica_id, 0)
        if not capacity <= self._outstanding.get(replica_id, 0) < self._ceiling.get(replica_id, 0):
            return False
        return self._overflowed.get(replica_id, 0) < math.ceil(capacity * self.overflow)

    def _overflow_wanted(self, replica_id: int) -> None:
        """No overflow room left and a tenant under its share waits here: one
        seat more than the overflow held was wanted, and the peak says so
        (the reserve above a found N grows by it; seats held alone would
        never show a demand the ceiling already turns away)."""
        if self._has_room(replica_id) or self._overflow_room(replica_id):
            return
        if self._overflow_peak.get(replica_id, 0) > self._overflowed.get(replica_id, 0):
            return
        if self._pick(replica_id, overflow=True) is not None:
            self._overflow_peak[replica_id] = self._overflowed.get(replica_id, 0) + 1

    def _under_served(self, replica_id: int, tenant_id: int) -> bool:
        """The tenant holds less than an even share of the replica's N among
        the tenants holding slots there (itself counted)."""
        held = self._held.get((replica_id, tenant_id), 0)
        holders = self._holders.get(replica_id, 0) + (0 if held else 1)
        return held * holders < self._capacity.get(replica_id, 0)

    def _lift(self, tenant_id: int) -> None:
        """No hoarded credit: a tenant joining the backlog starts no lower than
        the least backlogged counter (or the last to leave, if none waits)."""
        if tenant_id in self._waiting:
            return
        if self._waiting:
            floor = min(self._counters.get(t, 0.0) for t in self._waiting)
        elif self._last_left is not None:
            floor = self._counters.get(self._last_left, 0.0)
        else:
            return
        if self._counters.get(tenant_id, 0.0) < floor:
            self._counters[tenant_id] = floor
            if self._track:
                net = floor - self._deltas.get(tenant_id, 0.0)
                self._floors[tenant_id] = max(self._floors.get(tenant_id, net), net)

    def _grant(
        self,
        replica_id: int,
        *,
        tenant_id: int,
        priority: int,
        weight: float,  # ok-float
        own: bool,
        prompt_tokens: int,
        queued_seconds: float,  # ok-float
        overflow: bool = False,
    ) -> Slot:
        if overflow:
            held = self._overflowed.get(replica_id, 0) + 1
            self._overflowed[replica_id] = held
            self._overflow_peak[replica_id] = max(held, self._overflow_peak.get(replica_id, 0))
        if not own:
            self._charge(tenant_id, prompt_tokens / weight)
            key = (replica_id, tenant_id)
            self._held[key] = self._held.get(key, 0) + 1
            if self._held[key] == 1:
                self._holders[replica_id] = self._holders.get(replica_id, 0) + 1
        self._outstanding[replica_id] = self._outstanding.get(replica_id, 0) + 1
        if tenant_id not in self._waiting:
            self._last_left = tenant_id
        return Slot(
            self,
            replica_id=replica_id,
            tenant_id=tenant_id,
            priority=priority,
            weight=weight,
            own=own,
            prompt_tokens=prompt_tokens,
            queued_seconds=queued_seconds,
            overflow=overflow,
        )

    def _slot_release(self, slot: Slot, tokens: int) -> None:
        if slot.overflow:
            left = self._overflowed[slot.replica_id] - 1
            if left:
                self._overflowed[slot.replica_id] = left
            else:
                del self._overflowed[slot.replica_id]
        if not slot.own:
            self._charge(slot.tenant_id, tokens / slot.weight)
            key = (slot.replica_id, slot.tenant_id)
            held = self._held[key] - 1
            if held:
                self._held[key] = held
            else:
                del self._held[key]
                self._holders[slot.replica_id] -= 1
                if not self._holders[slot.replica_id]:
                    del self._holders[slot.replica_id]
        left = self._outstanding.get(slot.replica_id, 0) - 1
        if left > 0 or slot.replica_id in self._capacity:
            self._outstanding[slot.replica_id] = max(0, left)
        else:
            self._outstanding.pop(slot.replica_id, None)
        self._dispatch(slot.replica_id)

    def _enqueue(self, waiter: _Waiter) -> None:
        waiter.queued = True
        self._waiting[waiter.tenant_id] = self._waiting.get(waiter.tenant_id, 0) + 1
        self._depth[waiter.priority] = self._depth.get(waiter.priority, 0) + 1
        for replica_id in waiter.candidates:
            self._waiting_at[replica_id] = self._waiting_at.get(replica_id, 0) + 1
            tier = _OWN if replica_id in waiter.own else _SPILL
            flows = (
                self._index.setdefault(replica_id, {})
                .setdefault(tier, {})
                .setdefault(waiter.priority, {})
            )
            flows.setdefault(waiter.tenant_id, OrderedDict())[waiter.seq] = waiter

    def _dequeue(self, waiter: _Waiter) -> None:
        if not waiter.queued:
            return
        waiter.queued = False
        tenant_id, priority = waiter.tenant_id, waiter.priority
        for replica_id in waiter.candidates:
            self._waiting_at[replica_id] -= 1
            if not self._waiting_at[replica_id]:
                del self._waiting_at[replica_id]
            tier = _OWN if replica_id in waiter.own else _SPILL
            tiers = self._index[replica_id]
            classes = tiers[tier]
            flows = classes[priority]
            fifo = flows[tenant_id]
            del fifo[waiter.seq]
            if not fifo:
                del flows[tenant_id]
                if not flows:
                    del classes[priority]
                    if not classes:
                        del tiers[tier]
                        if not tiers:
                            del self._index[replica_id]
        self._waiting[tenant_id] -= 1
        if not self._waiting[tenant_id]:
            del self._waiting[tenant_id]
        self._depth[priority] -= 1
        if not self._depth[priority]:
            del self._depth[priority]
            self._passed.pop(priority, None)

    def _expire(self, waiter: _Waiter, timeout: float) -> None:  # ok-float
        if waiter.future.done():
            return
        self._dequeue(waiter)
        waited = self._clock() - waiter.enqueued_at
        waiter.future.set_exception(QueueTimeout(waited, timeout))

    def _abandon(self, waiter: _Waiter) -> None:
        """The waiting task was cancelled: leave the queue, or give back the
        slot it was granted before it could run."""
        self._dequeue(waiter)
        future = waiter.future
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result()._revoke()

    def _pick(
        self, replica_id: int, *, overflow: bool = False
    ) -> tuple[_Waiter, Iterable[int], int] | None:
        """The waiter next in line for a slot on this replica, the classes that
        were eligible for it, and the class chosen (no state changes). For
        an overflow slot: spill-over from tenants under their share only."""
        tiers = self._index.get(replica_id)
        if not tiers:
            return None
        if _OWN in tiers and not overflow:
            classes = tiers[_OWN]
        else:  # spill: only tenants under the headroom limit (or their share) here
            allowed = self._under_served if overflow else self._under_limit
            classes = {}
            for priority, flows in tiers.get(_SPILL, {}).items():
                under = {t: f for t, f in flows.items() if allowed(replica_id, t)}
                if under:
                    classes[priority] = under
            if not classes:
                return None
        chosen = self._class_choose(classes)
        flows = classes[chosen]
        tenant_id = min(flows, key=lambda t: (self._counters.get(t, 0.0), next(iter(flows[t]))))
        return next(iter(flows[tenant_id].values())), classes.keys(), chosen

    def _class_choose(self, eligible: Iterable[int]) -> int:
        starved = [p for p in eligible if self._passed.get(p, 0) >= self.starvation_passes]
        if starved:
            return max(starved, key=lambda p: (self._passed[p], -p))
        return min(eligible)

    def _passes_record(self, eligible: Iterable[int], chosen: int) -> None:
        for priority in eligible:
            if priority > chosen:
                self._passed[priority] = self._passed.get(priority, 0) + 1
        self._passed.pop(chosen, None)

    def _dispatch(self, replica_id: int) -> None:
        """Fill the replica's free slots from the queue, in the fair order,
        then its overflow with the requests of tenants under their share."""
        while True:
            overflow = not self._has_room(replica_id)
            if overflow and not self._overflow_room(replica_id):
                self._overflow_wanted(replica_id)
                return
            picked = self._pick(replica_id, overflow=overflow)
            if picked is None:
                return
            waiter, eligible, chosen = picked
            if waiter.future.done():  # cancelled; its task has not unwound yet
                self._dequeue(waiter)
                continue
            self._passes_record(list(eligible), chosen)
            self._dequeue(waiter)
            slot = self._grant(
                replica_id,
                tenant_id=waiter.tenant_id,
                priority=waiter.priority,
                weight=waiter.weight,
                own=replica_id in waiter.own,
                prompt_tokens=waiter.prompt_tokens,
                queued_seconds=self._clock() - waiter.enqueued_at,
                overflow=overflow,
            )
            waiter.future.set_result(slot)
