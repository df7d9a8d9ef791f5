"""The gateway as a process: what starts and stops with it, its background
loops, its health, and the routes of its ASGI application (gateway.app),
in front of the request path (gateway.pipeline).

    POST /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings
    GET /v1/models, GET /healthz (alive: nothing more)

Run it with `manage.py gateway` (uvicorn, uvloop, httptools), which also
serves /metrics and the detailed health on a port of their own, apart from
the one tenants call (gateway/operator.py); this process answers them
through its operator channel (`health`, `scrape_gauges_set`).

Background loops: the event loop's lag watched while requests are in
flight, the fleet read again when it changes, API keys' last use written,
the database's change notifications heard (keys, terms, spend corrections,
the fleet), replicas' health checked, and, with Redis, the fair queue's
share of each replica agreed with the other gateways."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections import deque

import orjson
from django.conf import settings
from django.db import DatabaseError

from core.heap import CollectorPauses, startup_heap_freeze
from core.outages import database_outage_report
from core.redis_clients import limits_redis_url
from gateway.adaptive import AdaptiveConcurrency
from gateway.admission import LocalAdmission, RedisAdmission, admission_from_settings
from gateway.answers import respond, respond_refused
from gateway.callers import CallerCache, CallerRefused, TermsCache
from gateway.changes import ChangesListener
from gateway.errors import error_body
from gateway.exchange import Receive
from gateway.fairness_redis import FairQueueRedisShare
from gateway.fleet import Router, fleet_snapshot_load
from gateway.health_checks import HealthChecks
from gateway.intake import authenticate
from gateway.operator_channel import WorkerChannel
from gateway.orm import orm
from gateway.outcome import Send
from gateway.payload import ENDPOINTS
from gateway.perf_metrics import PerfMetrics
from gateway.pipeline import Pipeline
from gateway.queueing import GatewayQueue
from gateway.recorder import Recorder
from gateway.spend import SpendGuard
from gateway.stalls import LagRecord, StallClock
from gateway.telemetry import (
    BACKLOG,
    LOOP_LAG_SECONDS,
    SPOOL_BYTES,
    SPOOL_FULL,
    SPOOL_OLDEST_SECONDS,
    concurrency_set,
    depth_by_class,
    queue_gauges_set,
)
from gateway.upstream_http import UpstreamClient

logger = logging.getLogger("gateway")

GC_YOUNG_OBJECTS = 10_000  # the collector's first threshold (see startup)
FLEET_RETRY_SECONDS = 1.0  # after a failed read of the fleet
ALIVE = orjson.dumps({"status": "ok"})  # the tenant port's /healthz: nothing about the fleet


class Gateway:
    """One per gateway process (each uvicorn worker is one)."""

    def __init__(self) -> None:
        cfg = settings.GATEWAY
        self.cfg = cfg
        stale = cfg["STALE_IF_ERROR_SECONDS"]
        self.callers = CallerCache(ttl_seconds=cfg["KEY_CACHE_SECONDS"], stale_seconds=stale)
        self.terms = TermsCache(ttl_seconds=cfg["TERMS_CACHE_SECONDS"], stale_seconds=stale)
        self.router = Router(suspect_seconds=cfg["SUSPECT_SECONDS"])
        self.adaptive = AdaptiveConcurrency.from_settings(self.router, cfg)  # each replica's N
        self._concurrency_written: dict[int, int] = {}
        # Made at startup, on the process's event loop:
        self.session: UpstreamClient | None = None  # to the replicas
        self.recorder: Recorder | None = None
        self.perf_metrics: PerfMetrics | None = None  # TensorRT-LLM's timings, read apart
        self.admission: LocalAdmission | RedisAdmission | None = None
        self.queue: GatewayQueue | None = None  # unbounded with fair queuing off
        self.queue_share: FairQueueRedisShare | None = None  # ... across gateways
        self.spend: SpendGuard | None = None  # budgets and prepaid credit held per request
        self.pipeline: Pipeline | None = None  # the request path
        self.operator_channel: WorkerChannel | None = None  # what the operator listener asks
        self.changes = ChangesListener(
            on_terms=self._forget,
            on_missed=self._expire,
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

    # --- lifecycle ---------------------------------------------------------
    async def startup(self) -> None:
        self.session = UpstreamClient(keepalive_seconds=self.cfg["UPSTREAM_KEEPALIVE_SECONDS"])
        self.perf_metrics = PerfMetrics(self.session)
        redis_url = limits_redis_url()
        self.admission = admission_from_settings(self.cfg, redis_url=redis_url)
        self.spend = SpendGuard.from_settings(self.cfg, redis_url=redis_url)
        self.queue = GatewayQueue.from_settings(self.cfg, self.admission, redis_url=redis_url)
        if self.queue.holds:  # the reserve above each found N follows its overflow
            self.adaptive.overflow_seen = self.queue.fair.overflow_peaks_take
        if redis_url and self.queue.holds:
            self.queue_share = FairQueueRedisShare(
                redis_url, queue=self.queue.fair, prefix=self.cfg["REDIS_PREFIX"]
            )
        self.recorder = Recorder.from_settings(self.cfg)
        self.recorder.start()
        self.pipeline = Pipeline(
            cfg=self.cfg,
            callers=self.callers,
            terms=self.terms,
            router=self.router,
            queue=self.queue,
            spend=self.spend,
            recorder=self.recorder,
            session=self.session,
            perf_metrics=self.perf_metrics,
        )
        self.router.snapshot = await orm(fleet_snapshot_load)
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
            asyncio.create_task(
                self.adaptive.run(self._queue_replicas_sync), name="adaptive-concurrency"
            ),
            asyncio.create_task(self._write_concurrency(), name="concurrency-write"),
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
        await self.callers.used_write()
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

    # --- background loops --------------------------------------------------
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
                self.router.snapshot = await orm(fleet_snapshot_load)
                failed = False
            except DatabaseError as exc:
                # Transient (a lost connection, a deadlock against a TRUNCATE or
                # a migration): the next refresh tries again; an outage is one
                # line per episode (core.outages).
                doing = "gateway refreshing the fleet (keeping the last snapshot)"
                if not database_outage_report(exc, doing=doing, log=logger):
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
        """Each replica's N: found (adaptive), or its max_inflight."""
        replicas = self.router.snapshot.replicas_by_model.values()
        return {r.id: self.adaptive.limit(r) for group in replicas for r in group}

    def _fleet_ceilings(self) -> dict[int, int]:
        """The most each replica may take: its max_inflight (past a found N,
        the fair queue's overflow)."""
        replicas = self.router.snapshot.replicas_by_model.values()
        return {r.id: r.max_inflight for group in replicas for r in group}

    async def _write_concurrency(self, period: float = 10.0) -> None:
        """The N found of each adaptive replica, into its row (/fleet/ shows
        it) when it moved: a few rows every few seconds, never per request."""
        from serving.services import replica_concurrency_record

        while True:
            await asyncio.sleep(period)
            found = self.adaptive.found()
            moved = {rid: n for rid, n in found.items() if self._concurrency_written.get(rid) != n}
            if not moved:
                continue
            try:
                await orm(replica_concurrency_record, limits=moved)
                self._concurrency_written.update(moved)
            except Exception:  # the next round writes it
                logger.warning("could not record the replicas' concurrency", exc_info=True)

    async def _queue_replicas_sync(self) -> None:
        """The fair queue's replicas and their slots: each replica's
        max_inflight in one process, this process's share of it with Redis."""
        if self.queue_share is not None:
            await self.queue_share.sync(self._fleet_max_inflight(), self._fleet_ceilings())
        elif self.queue is not None and self.queue.holds:
            self.queue.fair.replicas_sync(self._fleet_max_inflight(), self._fleet_ceilings())

    async def _share_queue(self) -> None:
        while True:
            await asyncio.sleep(self.cfg["QUEUE_SYNC_SECONDS"])
            await self._queue_replicas_sync()

    async def _flush_key_usage(self) -> None:
        while True:
            await asyncio.sleep(10)
            await self.callers.used_write()

    def _forget(self, tenant_id: int | None) -> None:
        """A change to what `tenant_id`'s requests are held to (None: every
        tenant's): its keys and terms are read again."""
        self.callers.forget(tenant_id)
        self.terms.forget(tenant_id)

    def _expire(self) -> None:
        """Changes may have gone unheard: every key and terms read again
        before its next use (still known meanwhile)."""
        self.callers.expire()
        self.terms.expire()

    async def _apply_corrections(self, correction_id: int | None) -> None:
        if self.spend is not None:
            await self.spend.corrections_apply(correction_id)

    # --- routes ------------------------------------------------------------
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
            await self._models(scope, send)
        else:
            await respond(send, 404, error_body(404, f"no route for {method} {path}"))

    async def completion(self, scope: dict, receive: Receive, send: Send, kind: str) -> None:
        """A completion request, through the pipeline."""
        await self.pipeline.completion(scope, receive, send, kind)

    async def _models(self, scope: dict, send: Send) -> None:
        """GET /v1/models: the models the caller may ask for, its adapters too."""
        try:
            caller = await authenticate(self.callers, scope)
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

    # --- health ------------------------------------------------------------
    def queue_state(self) -> dict | None:
        """The fair queue now (None with fair queuing off): requests waiting
        per priority class and, per replica, this process's slots, those in
        use and the requests waiting that could run there."""
        if self.queue is None or not self.queue.holds:
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
        concurrency_set({name: r["n"] for name, r in self.adaptive.state().items()})
        spool = self.recorder.spool if self.recorder else None
        if spool is not None:
            SPOOL_BYTES.set(spool.stats.bytes)
            SPOOL_OLDEST_SECONDS.set(spool.oldest_unacked_age())
            SPOOL_FULL.set(int(spool.full))
        queue = self.queue_state()
        if queue is not None:
            queue_gauges_set(
                queue["waiting_by_class"],
                {name: r["outstanding"] for name, r in queue["replicas"].items()},
            )
        return {}

    def spool_state(self) -> dict | None:
        """The durable spool (None without one): its disk use, the oldest
        record the ledger does not hold yet, what it replayed on starting."""
        spool = self.recorder.spool if self.recorder else None
        if spool is None:
            return None
        stats = spool.stats
        return {
            "dir": str(spool.dir),
            "bytes": stats.bytes,
            "cap_bytes": spool.cap_bytes,
            "full": spool.full,
            "unwritten": spool.unacked,
            "oldest_unwritten_seconds": round(spool.oldest_unacked_age(), 3),
            "replayed": stats.replayed,
            "replays_written": self.recorder.replays_written,
            "torn": stats.torn,
            "torn_bytes": stats.torn_bytes,
            "slots_adopted": stats.slots_adopted,
            "syncs": stats.syncs,
        }

    def health(self) -> dict:
        """This worker's detail, for the operator listener's /healthz."""
        snapshot = self.router.snapshot
        return {
            "status": "ok",
            "fair_queuing": self.queue is not None and self.queue.holds,
            "queue": self.queue_state(),
            # Adaptive replicas' N and the step-time floor each is held to.
            "concurrency": self.adaptive.state(),
            "fleet_loaded_at": snapshot.loaded_at,
            "replicas": sum(len(r) for r in snapshot.replicas_by_model.values()),
            "record_backlog": self.recorder.backlog if self.recorder else 0,
            "listening_for_changes": self.changes.listening,
            "records_flushed": self.recorder.flushed if self.recorder else 0,
            "records_dead_lettered": self.recorder.dead_lettered if self.recorder else 0,
            "records_dropped": self.recorder.dropped if self.recorder else 0,
            "spool": self.spool_state(),
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
