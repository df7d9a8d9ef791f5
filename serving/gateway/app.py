"""The gateway's ASGI application.

    POST /v1/chat/completions, POST /v1/completions, GET /v1/models,
    GET /healthz, GET /metrics (Prometheus)

Run it with `manage.py gateway` (uvicorn, uvloop, httptools)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
django.setup()

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from serving.choices import RequestStatus  # noqa: E402
from serving.gateway.admission import LocalAdmission, RedisAdmission  # noqa: E402
from serving.gateway.callers import Caller, CallerCache, CallerRefused  # noqa: E402
from serving.gateway.errors import error_body  # noqa: E402
from serving.gateway.fleet import Router, fleet_snapshot_load  # noqa: E402
from serving.gateway.payload import BadRequest, Prepared, prepare  # noqa: E402
from serving.gateway.proxy import (  # noqa: E402
    Outcome,
    UpstreamCall,
    UpstreamTimeouts,
    UpstreamUnavailable,
    call_stream,
    call_unary,
    ms,
)
from serving.gateway.recorder import Recorder  # noqa: E402
from serving.gateway.telemetry import BACKLOG, exposition, request_observe  # noqa: E402
from serving.records import MODEL_NAME_MAX, CompletedRequest, record_sink  # noqa: E402

logger = logging.getLogger("serving.gateway")

ENDPOINTS = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}
MAX_BODY_BYTES = 8 * 1024 * 1024
JSON = (b"content-type", b"application/json")
PROMETHEUS = b"text/plain; version=0.0.4; charset=utf-8"


class Gateway:
    def __init__(self) -> None:
        cfg = settings.GATEWAY
        self.cfg = cfg
        self.callers = CallerCache(ttl_seconds=cfg["KEY_CACHE_SECONDS"])
        self.router = Router(suspect_seconds=cfg["SUSPECT_SECONDS"])
        self.timeouts = UpstreamTimeouts(
            connect=cfg["UPSTREAM_CONNECT_TIMEOUT"],
            first_byte=cfg["UPSTREAM_FIRST_BYTE_TIMEOUT"],
            read=cfg["UPSTREAM_READ_TIMEOUT"],
        )
        self.session: aiohttp.ClientSession | None = None
        self.recorder: Recorder | None = None
        self.admission: LocalAdmission | RedisAdmission | None = None
        self._tasks: list[asyncio.Task] = []
        self.loop_lag_max = 0.0  # ok-float: seconds, a health statistic
        self.gc_pause_max = 0.0  # ok-float: seconds, a health statistic
        self.stalls: deque[tuple[float, float]] = deque(maxlen=20)  # (epoch s, lag s)
        self._gc_started = 0.0  # ok-float: perf_counter

    # --- lifecycle ---------------------------------------------------------
    async def startup(self) -> None:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ttl_dns_cache=300),
            auto_decompress=False,
        )
        if settings.REDIS_URL:
            self.admission = RedisAdmission(
                settings.REDIS_URL,
                lease_seconds=self.cfg["UPSTREAM_READ_TIMEOUT"] + 60,
                prefix=self.cfg["REDIS_PREFIX"],
            )
        else:
            self.admission = LocalAdmission()
        self.recorder = Recorder(
            record_sink(),
            flush_seconds=self.cfg["RECORD_FLUSH_SECONDS"],
            flush_max=self.cfg["RECORD_FLUSH_MAX"],
            dead_letter_path=Path(self.cfg["DEAD_LETTER_PATH"]),
        )
        self.recorder.start()
        self.router.snapshot = await asyncio.to_thread(fleet_snapshot_load)
        # Everything loaded so far (Django, settings, the snapshot) lives for
        # the whole process: keep it out of the collector's full passes, which
        # otherwise pause the event loop for every request in flight.
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._time_gc)
        self._tasks = [
            asyncio.create_task(self._watch_loop_lag(), name="loop-lag"),
            asyncio.create_task(self._refresh_fleet(), name="fleet-refresh"),
            asyncio.create_task(self._flush_key_usage(), name="key-usage"),
        ]

    async def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self._mark_keys_used()
        if self.recorder is not None:
            await self.recorder.close()
        if self.session is not None:
            await self.session.close()
        if self.admission is not None:
            await self.admission.close()

    def _time_gc(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_pause_max = max(self.gc_pause_max, time.perf_counter() - self._gc_started)

    async def _watch_loop_lag(self, period: float = 0.05) -> None:
        """How late the event loop wakes up: time any request waited behind
        something else in this process (GC, a thread holding the GIL, CPU)."""
        while True:
            started = time.perf_counter()
            await asyncio.sleep(period)
            lag = time.perf_counter() - started - period
            self.loop_lag_max = max(self.loop_lag_max, lag)
            if lag > 0.1:
                self.stalls.append((time.time(), lag))

    async def _refresh_fleet(self) -> None:
        while True:
            await asyncio.sleep(self.cfg["FLEET_REFRESH_SECONDS"])
            try:
                self.router.snapshot = await asyncio.to_thread(fleet_snapshot_load)
            except Exception:
                logger.exception("fleet refresh failed; keeping the last snapshot")

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

    # --- requests ----------------------------------------------------------
    async def handle(self, scope: dict, receive, send) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/healthz":
            await respond(send, 200, orjson.dumps(self.health()))
        elif path == "/metrics":
            BACKLOG.set(self.recorder.backlog if self.recorder else 0)
            await respond(send, 200, exposition(), content_type=PROMETHEUS)
        elif path in ENDPOINTS:
            if method != "POST":
                await respond(send, 405, error_body(405, f"use POST for {path}"))
            else:
                await self.completion(scope, receive, send, ENDPOINTS[path])
        elif path == "/v1/models":
            await self.models(scope, send)
        else:
            await respond(send, 404, error_body(404, f"no route for {method} {path}"))

    def health(self) -> dict:
        snapshot = self.router.snapshot
        return {
            "status": "ok",
            "fleet_loaded_at": snapshot.loaded_at,
            "replicas": sum(len(r) for r in snapshot.replicas_by_model.values()),
            "record_backlog": self.recorder.backlog if self.recorder else 0,
            "records_flushed": self.recorder.flushed if self.recorder else 0,
            "records_dead_lettered": self.recorder.dead_lettered if self.recorder else 0,
            "event_loop_lag_max_ms": round(self.loop_lag_max * 1000, 2),
            "gc_pause_max_ms": round(self.gc_pause_max * 1000, 2),
            "recent_stalls": [{"at": at, "ms": round(lag * 1000)} for at, lag in self.stalls],
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
            await respond(
                send, refused.status, error_body(refused.status, refused.message, code=refused.code)
            )
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
        received_at = timezone.now()
        request_id = f"gw-{uuid.uuid4().hex}"
        rid_header = (b"x-request-id", request_id.encode())
        try:
            caller = await self.authenticate(scope)
        except CallerRefused as refused:
            await respond(
                send,
                refused.status,
                error_body(refused.status, refused.message, code=refused.code),
                [rid_header],
            )
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
            record.http_status, record.error = bad.status, bad.message
            record.model = bad.model[:MODEL_NAME_MAX]  # an unknown model too: what was asked
            # A name the client made up never becomes a metrics label.
            unknown = bad.code == "model_not_found"
            self._finish(record, caller, model_label="unknown" if unknown else None)
            await respond(
                send,
                bad.status,
                error_body(bad.status, bad.message, param=bad.param, code=bad.code),
                [rid_header],
            )
            return
        record.model, record.stream = prepared.model, prepared.stream

        refusal = await self.admission.acquire(caller, request_id, prepared.estimated_tokens)
        if refusal is not None:
            record.http_status, record.error = 429, refusal.message
            self._finish(record, caller)
            await respond(
                send,
                429,
                error_body(429, refusal.message, code=refusal.limit),
                [rid_header, (b"retry-after", str(refusal.retry_after).encode())],
            )
            return
        try:
            await self._proxy(scope, receive, send, kind, caller, prepared, record, rid_header)
        finally:
            await self.admission.release(caller, request_id)

    async def _proxy(
        self,
        scope,
        receive,
        send,
        kind: str,
        caller: Caller,
        prepared: Prepared,
        record: CompletedRequest,
        rid_header,
    ) -> None:
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
        outcome: Outcome | None = None
        last_error = "no replica is serving this model"
        try:
            for replica in self.router.candidates(prepared.route_model, caller.tenant_id)[:2]:
                record.replica_id, record.pool_id = replica.id, replica.pool_id
                self.router.acquire(replica)
                call = UpstreamCall(
                    session=self.session,
                    url=replica.base_url + path,
                    body=prepared.body,
                    request_id=record.request_id,
                    timeouts=self.timeouts,
                    send=send,
                    extra_headers=[rid_header],
                )
                try:
                    if prepared.stream:
                        outcome = await call_stream(
                            call,
                            client_wants_usage=prepared.client_wants_usage,
                            client_wants_continuous_usage=prepared.client_wants_continuous_usage,
                            disconnected=disconnected,
                        )
                    else:
                        outcome = await call_unary(call)
                    break
                except UpstreamUnavailable as exc:
                    last_error = f"{replica.name}: {exc}"
                    logger.warning("request %s: %s", record.request_id, last_error)
                    self.router.mark_suspect(replica)
                finally:
                    self.router.release(replica)
        finally:
            watcher.cancel()
        if outcome is None:
            record.status, record.http_status, record.error = RequestStatus.ERROR, 503, last_error
            self._finish(record, caller)
            await respond(
                send,
                503,
                error_body(
                    503, f"no model server could take the request ({last_error})", code="no_replica"
                ),
                [rid_header],
            )
            return
        usage, metrics = outcome.usage, outcome.metrics
        record.status, record.http_status, record.error = (
            outcome.status,
            outcome.http_status,
            outcome.error,
        )
        record.sent_at, record.first_token_at = outcome.sent_at, outcome.first_token_at
        record.prompt_tokens = usage.get("prompt_tokens") or 0
        record.completion_tokens = usage.get("completion_tokens") or 0
        record.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        record.queue_ms = ms(metrics.get("queue_time_ms"))
        record.ttft_ms = ms(metrics.get("time_to_first_token_ms"))
        record.generation_ms = ms(metrics.get("generation_time_ms"))
        self._finish(record, caller)

    def _finish(
        self, record: CompletedRequest, caller: Caller, model_label: str | None = None
    ) -> None:
        record.ended_at = timezone.now()
        self.recorder.add(record)
        request_observe(record, tenant=caller.tenant_slug, model_label=model_label)


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


async def _watch_disconnect(receive, disconnected: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            disconnected.set()
            return


async def respond(
    send, status: int, body: bytes, headers: list | None = None, content_type: bytes = JSON[1]
) -> None:
    start_headers = [(b"content-type", content_type), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body})


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
