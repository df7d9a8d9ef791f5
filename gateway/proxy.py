"""Talking to one vLLM replica, streaming or not.

Before anything reaches the client, a replica that refuses the connection,
times out, or answers 5xx raises UpstreamUnavailable so the caller can try
another. After the response has started, failures end the stream with an
error event and the usage seen so far is kept."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

import aiohttp
import orjson
from django.utils import timezone

from gateway.errors import error_body

Send = Callable[[dict], Awaitable[None]]
EVENT_END = b"\n\n"
# Byte patterns, so the hot path never parses JSON per chunk. Whitespace
# tolerant: vLLM writes compact JSON, other OpenAI-compatible servers may not.
USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')
COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# A chunk's usage object (one level of nesting: prompt_tokens_details).
CHUNK_USAGE = re.compile(rb',\s*"usage"\s*:\s*\{(?:[^{}]|\{[^{}]*\})*\}')


class UpstreamUnavailable(Exception):
    """Nothing was sent to the client; another replica may be tried."""

    def __init__(self, reason: str, *, connection_failed: bool) -> None:
        super().__init__(reason)
        self.connection_failed = connection_failed


@dataclass
class Outcome:
    http_status: int
    status: str  # ok | aborted | error
    sent_at: datetime
    first_token_at: datetime | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    error: str = ""


@dataclass(frozen=True)
class UpstreamTimeouts:
    connect: float
    first_byte: float
    read: float


@dataclass(frozen=True)
class UpstreamCall:
    """One attempt at one replica."""

    session: aiohttp.ClientSession
    url: str
    body: bytes
    request_id: str
    timeouts: UpstreamTimeouts
    send: Send
    extra_headers: list[tuple[bytes, bytes]]
    # Told the output tokens so far as a stream's usage counts them.
    on_output: Callable[[int], None] | None = None


async def _open(call: UpstreamCall) -> tuple[aiohttp.ClientResponse, datetime]:
    """POST to the replica; a refused connection or a silent replica (no
    first byte in time) is UpstreamUnavailable."""
    sent_at = timezone.now()
    timeout = aiohttp.ClientTimeout(
        total=None, connect=call.timeouts.connect, sock_read=call.timeouts.first_byte
    )
    headers = {"Content-Type": "application/json", "X-Request-Id": call.request_id}
    for attempt in (1, 2):
        try:
            resp = await call.session.post(
                call.url, data=call.body, headers=headers, timeout=timeout
            )
        except (aiohttp.ClientConnectorError, TimeoutError) as exc:  # no connection, or silence
            raise UpstreamUnavailable(_describe(exc), connection_failed=True) from None
        except aiohttp.ClientConnectionError as exc:
            # Dropped before any answer: most often a pooled connection the
            # replica closed as it was reused. Once more, on another.
            if attempt == 2:
                raise UpstreamUnavailable(_describe(exc), connection_failed=True) from None
        else:
            return resp, sent_at
    raise AssertionError("unreachable")


async def _read(resp: aiohttp.ClientResponse) -> bytes:
    try:
        return await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:  # nothing was sent to the client yet
        raise UpstreamUnavailable(_describe(exc), connection_failed=True) from None


async def _answer_whole(call: UpstreamCall, resp: aiohttp.ClientResponse, raw: bytes) -> None:
    content_type = resp.headers.get("Content-Type", "application/json")
    await call.send(
        {
            "type": "http.response.start",
            "status": resp.status,
            "headers": [(b"content-type", content_type.encode()), *call.extra_headers],
        }
    )
    await call.send({"type": "http.response.body", "body": raw})


async def _relay_refusal(
    call: UpstreamCall, resp: aiohttp.ClientResponse, sent_at: datetime
) -> Outcome:
    """A non-200 answer: 5xx may be retried elsewhere; 4xx is the client's."""
    raw = await _read(resp)
    if resp.status >= 500:
        raise UpstreamUnavailable(f"replica answered {resp.status}", connection_failed=False)
    await _answer_whole(call, resp, raw)
    return Outcome(
        http_status=resp.status,
        status="error",
        sent_at=sent_at,
        error=raw[:300].decode(errors="replace"),
    )


async def call_unary(call: UpstreamCall) -> Outcome:
    resp, sent_at = await _open(call)
    try:
        if resp.status != 200:
            return await _relay_refusal(call, resp, sent_at)
        raw = await _read(resp)
        await _answer_whole(call, resp, raw)
    finally:
        resp.release()
    outcome = Outcome(http_status=200, status="ok", sent_at=sent_at)
    data = orjson.loads(raw)
    outcome.usage = data.get("usage") or {}
    outcome.metrics = data.get("metrics") or {}
    ttft = outcome.metrics.get("time_to_first_token_ms")
    if ttft is not None:
        # vLLM's TTFT runs from scheduling, after its queue time; its clock
        # may disagree a little with ours, and the token cannot be later
        # than the answer that carried it.
        queued = outcome.metrics.get("queue_time_ms") or 0
        outcome.first_token_at = min(
            sent_at + timedelta(milliseconds=queued + ttft), timezone.now()
        )
    return outcome


async def call_stream(
    call: UpstreamCall,
    *,
    client_wants_usage: bool,
    client_wants_continuous_usage: bool,
    disconnected: asyncio.Event,
) -> Outcome:
    resp, sent_at = await _open(call)
    try:
        if resp.status != 200:
            return await _relay_refusal(call, resp, sent_at)
        return await _relay(
            resp,
            call.send,
            call.extra_headers,
            sent_at,
            keep_final_usage=client_wants_usage,
            keep_chunk_usage=client_wants_continuous_usage,
            disconnected=disconnected,
            on_output=call.on_output,
        )
    finally:
        resp.close()  # on abort this closes the connection: vLLM aborts the request


async def _relay(
    resp: aiohttp.ClientResponse,
    send: Send,
    extra_headers: list[tuple[bytes, bytes]],
    sent_at: datetime,
    *,
    keep_final_usage: bool,
    keep_chunk_usage: bool,
    disconnected: asyncio.Event,
    on_output: Callable[[int], None] | None = None,
) -> Outcome:
    outcome = Outcome(http_status=200, status="ok", sent_at=sent_at)
    last_usage_event = b""
    started = False
    pending = b""
    try:
        async for chunk in resp.content.iter_any():
            if outcome.first_token_at is None:
                outcome.first_token_at = timezone.now()
            pending += chunk
            complete, sep, pending = pending.rpartition(EVENT_END)
            if not sep:
                pending = complete
                continue
            out = complete + EVENT_END
            if USAGE_OBJECT.search(out):
                last_usage_event = _last_usage_event(out) or last_usage_event
                if on_output is not None:
                    counts = COMPLETION_TOKENS.findall(last_usage_event)
                    if counts:
                        on_output(int(counts[-1]))
                if not (keep_final_usage and keep_chunk_usage):
                    out = _usage_as_requested(
                        out, keep_final=keep_final_usage, keep_chunks=keep_chunk_usage
                    )
            if not started:
                await send(
                    {
                        "type": "http.response.start",
                        "status": 200,
                        "headers": [
                            (b"content-type", b"text/event-stream"),
                            (b"cache-control", b"no-cache"),
                            *extra_headers,
                        ],
                    }
                )
                started = True
            if disconnected.is_set():
                outcome.status, outcome.http_status = "aborted", 499
                break
            if out:
                await send({"type": "http.response.body", "body": out, "more_body": True})
            # Neither a buffered upstream read nor an unpaused send yields to the
            # event loop: without this, a fast stream starves other requests and
            # the disconnect watcher.
            await asyncio.sleep(0)
            if disconnected.is_set():
                outcome.status, outcome.http_status = "aborted", 499
                break
    except (aiohttp.ClientError, TimeoutError) as exc:
        if not started:
            raise UpstreamUnavailable(_describe(exc), connection_failed=True) from None
        outcome.status, outcome.http_status, outcome.error = "error", 502, _describe(exc)
        message = error_body(
            502, f"the model server failed mid-stream: {outcome.error}", code="upstream_failed"
        )
        await send(
            {
                "type": "http.response.body",
                "body": b"data: " + message + EVENT_END,
                "more_body": True,
            }
        )
    if not started:  # an empty 200 stream
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), *extra_headers],
            }
        )
    if outcome.status == "ok" and pending:
        await send({"type": "http.response.body", "body": pending, "more_body": True})
    await send({"type": "http.response.body", "body": b""})
    if last_usage_event:
        data = orjson.loads(last_usage_event.split(b"data: ", 1)[1])
        outcome.usage = data.get("usage") or {}
        outcome.metrics = data.get("metrics") or {}
    return outcome


def _last_usage_event(block: bytes) -> bytes | None:
    for event in reversed(block.split(EVENT_END)):
        if event.startswith(b"data: {") and USAGE_OBJECT.search(event):
            return event
    return None


def _usage_as_requested(block: bytes, *, keep_final: bool, keep_chunks: bool) -> bytes:
    """The gateway always asks vLLM for usage on every chunk (to bill aborts);
    the client gets only what it asked for: the final usage-only chunk with
    include_usage, usage on content chunks with continuous_usage_stats."""
    out = []
    for event in block.split(EVENT_END):
        if not event:
            continue
        if USAGE_ONLY.search(event):
            if keep_final:
                out.append(event + EVENT_END)
        elif not keep_chunks:
            out.append(CHUNK_USAGE.sub(b"", event) + EVENT_END)
        else:
            out.append(event + EVENT_END)
    return b"".join(out)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the model server"
    return f"{type(exc).__name__}: {exc}"[:300]


def ms(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value)).quantize(Decimal("0.001"))
