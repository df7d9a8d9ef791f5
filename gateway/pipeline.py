"""The gateway's request path: a completion request through small stages
that share one context (gateway.exchange.Exchange), each refusing with
Rejected where the request ends:

    authenticate -> parse -> admit -> hold spend -> queue -> dispatch and relay -> record

- authenticate, parse (gateway.intake): its key, its body prepared.
- admit: a request no wait can admit (more tokens than the tenant's whole
  in-flight or per-minute limit) is a 400 before anything is held for it.
- hold spend (gateway.spend): its worst case reserved on its tenant's
  budget or prepaid credit, settled to what it cost once it ends.
- queue (gateway.queueing): the tenant's budget, then a slot on a replica,
  in weighted fair order; with fair queuing off the queue is unbounded and
  the same path goes straight through.
- dispatch and relay (gateway.upstream): up to two replicas, each through a
  slot; a prefill replica runs the request disaggregated (gateway.disagg).
- record (gateway.recorder): one row for the ledger per request (per phase
  of a disaggregated one), whatever became of it, kept in the durable
  spool first; a request whose row could not be kept (a full spool) is
  refused before anything else. The answer's last bytes wait for its row
  (gateway.exchange.EndHeld): no client holds an answer its gateway's
  death could leave unrecorded.

One per gateway process, built by the process at startup
(gateway.process)."""

from __future__ import annotations

import itertools
import logging
import secrets
import time
from collections.abc import Sequence

from gateway.answers import respond_refused
from gateway.callers import CallerCache, CallerRefused, TermsCache
from gateway.disagg import disaggregated
from gateway.errors import Refused
from gateway.exchange import EndHeld, Exchange, Receive, Rejected
from gateway.fairness import Slot
from gateway.fleet import ReplicaInfo, Router
from gateway.intake import authenticate, parse
from gateway.outcome import Outcome, Send, UpstreamUnavailable, ms, now
from gateway.perf_metrics import PerfMetrics
from gateway.queueing import ClientGone, ClientWatch, GatewayQueue, QueueWait, never_fits
from gateway.recorder import Recorder
from gateway.recording import Recording
from gateway.relay import Relay
from gateway.spend import SpendGuard
from gateway.telemetry import queue_wait_observe
from gateway.upstream import UpstreamTimeouts
from gateway.upstream_http import UpstreamClient
from metering.choices import Phase
from serving.choices import ReplicaRole, RequestStatus
from serving.records import CompletedRequest, gateway_request_id

logger = logging.getLogger("gateway")

NO_REPLICA = "no replica is serving this model"
METERING_UNAVAILABLE = Refused(
    503,
    "metering_unavailable",
    "the gateway cannot record usage right now (its spool is full): try again shortly",
    retry_after=5,
)


class Pipeline:
    def __init__(
        self,
        *,
        cfg: dict,
        callers: CallerCache,
        terms: TermsCache,
        router: Router,
        queue: GatewayQueue,
        spend: SpendGuard,
        recorder: Recorder,
        session: UpstreamClient,
        perf_metrics: PerfMetrics,
    ) -> None:
        """One stage's means each; `router`, `relay`, `recording` and `slot`
        are also what a disaggregated request asks for (gateway.disagg.Dispatch)."""
        self.max_tokens = cfg["DEFAULT_MAX_TOKENS"]  # a request that sets none
        self.callers = callers
        self.terms = terms
        self.router = router
        self.queue = queue
        self.spend = spend
        timeouts = UpstreamTimeouts(
            connect=cfg["UPSTREAM_CONNECT_TIMEOUT"],
            first_byte=cfg["UPSTREAM_FIRST_BYTE_TIMEOUT"],
            read=cfg["UPSTREAM_READ_TIMEOUT"],
        )
        self.relay = Relay(session, timeouts)
        self.recording = Recording(recorder, perf_metrics, worker_of=router.worker)
        self._id_prefix = secrets.token_hex(8)  # this process's (built at its startup)
        self._id_numbers = itertools.count()

    def request_id_new(self) -> str:
        """A request id unique across gateway processes: this process's
        random half, the hour, and its count (serving.records). Not a uuid4:
        the kernel's randomness per request cost 3% of the gateway's CPU
        (bench/gateway.py, profiled)."""
        return gateway_request_id(
            self._id_prefix, hour=int(time.time()) // 3600, number=next(self._id_numbers)
        )

    async def completion(self, scope: dict, receive: Receive, send: Send, kind: str) -> None:
        received_at = now()
        request_id = self.request_id_new()
        rid_header = (b"x-request-id", request_id.encode())
        if not self.recording.recorder.accepting():  # its record could not be kept
            await respond_refused(send, METERING_UNAVAILABLE, [rid_header])
            return
        try:
            caller = await authenticate(self.callers, scope)
        except CallerRefused as refused:
            await respond_refused(send, refused.refused, [rid_header])
            return
        record = CompletedRequest(
            request_id=request_id,
            tenant_id=caller.tenant_id,
            api_key_id=caller.api_key_id,
            model="",
            received_at=received_at,
            ended_at=received_at,
            status=RequestStatus.REJECTED,
            http_status=400,
            priority=caller.priority,
        )
        held = EndHeld(send)  # the answer ends once its record is kept
        ex = Exchange(
            caller=caller,
            record=record,
            kind=kind,
            receive=receive,
            send=held,
            rid_header=rid_header,
            disconnected=ClientWatch(receive),
        )
        try:
            try:
                await parse(ex, fleet=self.router.snapshot, default_max_tokens=self.max_tokens)
                self._admit(ex)
                await self._hold(ex)
                await self._queued(ex)
            except Rejected as rejected:
                await self.recording.rejected(ex, rejected, queued=self.queue.holds)
            except ClientGone:
                gone = Rejected(None, status=499, error="client disconnected while queued")
                await self.recording.rejected(ex, gone, queued=self.queue.holds)
        finally:
            ex.disconnected.stop()
            try:
                await held.release()  # recorded (or failed on the way): the answer ends
            finally:
                if ex.hold is not None:
                    await self._settle(ex)

    # --- admit, hold spend ---------------------------------------------------
    def _admit(self, ex: Exchange) -> None:
        prepared = ex.prepared
        refused = never_fits(ex.caller, prepared.estimated_tokens, param=prepared.max_tokens_field)
        if refused is not None:  # before anything is held for it
            raise Rejected(refused)

    async def _hold(self, ex: Exchange) -> None:
        """Its worst case reserved on its tenant's spend accounts, if it has any."""
        caller, prepared = ex.caller, ex.prepared
        try:
            terms = await self.terms.get(caller.tenant_id)
        except CallerRefused as unreadable:  # its terms unknown: nothing is held for it
            raise Rejected(unreadable.refused) from None
        if terms is None:
            return
        hold = await self.spend.reserve(
            terms,
            model=prepared.route_model,
            request_id=ex.record.request_id,
            prompt_tokens_max=prepared.prompt_tokens_max,
            output_tokens_max=prepared.output_tokens_max,
            choices=prepared.choices,
            gpus=lambda: self.router.gpus_at_most(prepared.route_model, caller.tenant_id),
            output_field=prepared.max_tokens_field if prepared.generates else None,
        )
        if isinstance(hold, Refused):
            raise Rejected(hold)
        ex.hold = hold

    async def _settle(self, ex: Exchange) -> None:
        record = ex.record
        # A disaggregated request's prompt is its prefill's (its decode read
        # it as KV cache): as the ledger bills it.
        prompt, cached = ex.prefill_prompt or (record.prompt_tokens, record.cached_tokens)
        await self.spend.settle(
            ex.hold,
            prompt=prompt,
            cached=cached,
            completion=record.completion_tokens,
            received_at=record.received_at.timestamp(),
        )

    # --- queue, dispatch -------------------------------------------------------
    async def _queued(self, ex: Exchange) -> None:
        """Wait for the tenant's budget, then run it; a client that goes away
        meanwhile leaves at once."""
        caller, request_id = ex.caller, ex.record.request_id
        ex.wait = self.queue.wait_for(caller)
        refused = await self.queue.admit(
            caller,
            request_id,
            ex.prepared.estimated_tokens,
            wait=ex.wait,
            disconnected=ex.disconnected,
        )
        if refused is not None:
            raise Rejected(refused)
        try:
            await self._dispatched(ex)
        finally:
            await self.queue.admission.release(caller, request_id)

    async def _dispatched(self, ex: Exchange) -> None:
        """Up to two replicas, each through a slot of the queue. A slot on a
        replica that failed before answering is given back uncharged, and
        the request queues again (same timeout) for a slot on another."""
        prepared, caller = ex.prepared, ex.caller
        holds = self.queue.holds
        outcome: Outcome | None = None
        last_error = NO_REPLICA
        tried: list[int] = []
        for _attempt in range(2):
            usable = self.router.candidates(
                prepared.route_model, caller.tenant_id, disaggregable=prepared.disaggregable
            )
            candidates = [r for r in usable if r.id not in tried] if tried else usable
            if not candidates:
                break
            slot = await self.slot(
                ex, candidates, prompt_tokens=prepared.prompt_tokens_estimate, wait=ex.wait
            )
            if holds and not tried:
                queue_wait_observe(caller.priority, ex.wait.waited)
            replica = next(r for r in candidates if r.id == slot.replica_id)
            tried.append(replica.id)
            ex.slot = slot
            try:
                outcome, error = await self._attempt(ex, replica)
                if outcome is None:
                    last_error = error
                    slot.release(0, 0)  # it never ran: uncharged
            finally:
                _slot_settle(slot, outcome)
            if outcome is not None:
                break
        if holds:
            ex.record.gateway_queue_ms = ms(ex.wait.waited * 1000)
        await self.recording.answered(ex, outcome, last_error)

    async def slot(
        self,
        ex: Exchange,
        replicas: Sequence[ReplicaInfo],
        *,
        prompt_tokens: int,
        wait: QueueWait,
    ) -> Slot:
        """A slot on one of `replicas` (preference order); Rejected when the
        queue refuses it (timeout, full), ClientGone when its client left."""
        slot = await self.queue.slot(
            ex.caller,
            replicas,
            is_own=self.router.is_own,
            prompt_tokens=prompt_tokens,
            wait=wait,
            disconnected=ex.disconnected,
        )
        if isinstance(slot, Refused):
            raise Rejected(slot)
        return slot

    async def _attempt(self, ex: Exchange, replica: ReplicaInfo) -> tuple[Outcome | None, str]:
        """One replica's try: the outcome, or none and why (the replica is
        then marked suspect). On a prefill replica, the request's prefill
        there, then its decode on a decode replica of the pool."""
        record = ex.record
        record.replica_id, record.pool_id = replica.id, replica.pool_id
        # On a prefill replica the row is its phase's, whatever becomes of it.
        record.phase = Phase.PREFILL if replica.role == ReplicaRole.PREFILL else Phase.WHOLE
        self.router.acquire(replica)
        try:
            async with self.spend.running(
                ex.hold, tenant_id=record.tenant_id, replica_id=replica.id, gpus=replica.gpus
            ) as cut:
                if replica.role == ReplicaRole.PREFILL:
                    outcome = await disaggregated(self, ex, replica, cut=cut)
                else:
                    outcome = await self.relay.upstream(
                        ex, replica, cut=cut, on_output=ex.slot.output_counter
                    )
            self.router.answered(replica)
            return outcome, ""
        except UpstreamUnavailable as exc:
            error = f"{replica.name}: {exc}"
            logger.warning("request %s: %s", record.request_id, error)
            if exc.replica_fault:
                self.router.mark_suspect(replica)
            return None, error
        finally:
            self.router.release(replica)


def _slot_settle(slot: Slot, outcome: Outcome | None) -> None:
    """Free the slot, charging what the request actually used (vLLM's
    usage); without an outcome, the prompt estimate charged at dispatch."""
    if outcome is None:
        slot.release(0)
    else:
        usage = outcome.usage
        slot.release(usage.get("completion_tokens") or 0, usage.get("prompt_tokens") or None)
