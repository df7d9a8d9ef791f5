"""Talking to one replica, streaming or not, in its engine's dialect
(serving.engines: what it takes, how it reports usage and timing).

Before anything reaches the client, a replica that refuses the connection,
times out, or answers 5xx raises UpstreamUnavailable so the caller can try
another. After the response has started, failures end the stream with an
error event and the usage seen so far is kept. What the stream's events
hold is read by gateway.sse; the answers are written by gateway.answers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson

from gateway.answers import error_event_send, respond, respond_refused
from gateway.errors import upstream_fault
from gateway.outcome import (
    Cut,
    Gone,
    Outcome,
    Send,
    UpstreamUnavailable,
    cut_outcome,
    describe,
    now,
)
from gateway.sse import (
    CHUNK_ID,
    COMPLETION_TOKENS,
    CONTENT_DELTA,
    EVENT_END,
    OUTPUT_DELTA,
    USAGE_OBJECT,
    event_data,
    extension_removed,
    last_event_with,
    usage_as_requested,
    usage_event_last,
)
from gateway.unstream import unstreamed, usage_normalized
from gateway.upstream_http import (
    ConnectFailed,
    Dropped,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
)
from serving.choices import Engine
from serving.engines import ENGINES, EngineSpec


@dataclass(frozen=True)
class UpstreamTimeouts:
    connect: float
    first_byte: float
    read: float


@dataclass(frozen=True)
class UpstreamCall:
    """One attempt at one replica."""

    session: UpstreamClient
    url: str
    body: bytes
    request_id: str
    timeouts: UpstreamTimeouts
    send: Send
    extra_headers: list[tuple[bytes, bytes]]
    # Told the output tokens so far as a stream's usage counts them.
    on_output: Callable[[int], None] | None = None
    cut: Cut | None = None
    kind: str = "chat"  # chat | completion | responses (gateway.payload)
    # The gateway's own count of the prompt (its bytes over the model's
    # characters per token): billed when the replica cannot count it.
    prompt_tokens_estimate: int = 0
    engine: EngineSpec = ENGINES[Engine.VLLM]
    # The engine's extension the gateway asked for and the client did not:
    # taken out of what the client gets (None: nothing to take out).
    strip: str | None = None

    @property
    def counted_by(self) -> re.Pattern | None:
        """What counts a stream's output until its usage comes: the
        Responses API's text events, or, from an engine that gives no usage
        on every chunk, its text chunks."""
        if self.kind == "responses":
            return OUTPUT_DELTA
        return None if self.engine.continuous_usage else CONTENT_DELTA


async def _open(call: UpstreamCall) -> tuple[UpstreamResponse, datetime]:
    """POST to the replica; a refused connection or a silent replica (no
    first byte in time) is UpstreamUnavailable. The read timeout bounds
    every wait for data, the first byte's and each one after it."""
    sent_at = now()
    headers = [(b"content-type", b"application/json"), (b"x-request-id", call.request_id.encode())]
    for attempt in (1, 2):
        try:
            resp = await call.session.request(
                "POST",
                call.url,
                call.body,
                headers,
                connect_timeout=call.timeouts.connect,
                read_timeout=call.timeouts.first_byte,
            )
        except (ConnectFailed, TimeoutError) as exc:  # no connection, or silence
            raise UpstreamUnavailable(describe(exc), connection_failed=True) from None
        except Dropped as exc:
            # Dropped before any answer: most often a pooled connection the
            # replica closed as it was reused. Once more, on another.
            if attempt == 2:
                raise UpstreamUnavailable(describe(exc), connection_failed=True) from None
        else:
            if call.cut is not None:
                call.cut.on_fire(resp.close)  # stopping it closes the connection
            return resp, sent_at
    raise AssertionError("unreachable")


async def _read(resp: UpstreamResponse) -> bytes:
    try:
        return await resp.read()
    except (UpstreamError, TimeoutError) as exc:  # nothing was sent to the client yet
        raise UpstreamUnavailable(describe(exc), connection_failed=True) from None


async def _answer_whole(call: UpstreamCall, resp: UpstreamResponse, raw: bytes) -> None:
    content_type = resp.headers.get("Content-Type", "application/json").encode()
    await respond(call.send, resp.status, raw, call.extra_headers, content_type)


async def _relay_refusal(call: UpstreamCall, resp: UpstreamResponse, sent_at: datetime) -> Outcome:
    """A non-200 answer: 5xx may be retried elsewhere; 4xx is the client's,
    in OpenAI's error shape whatever the engine's (a stream refused before
    it started too)."""
    raw = await _read(resp)
    if resp.status >= 500:
        raise UpstreamUnavailable(f"replica answered {resp.status}", connection_failed=False)
    return await _answer_fault(call, resp.status, raw, sent_at)


async def _answer_fault(call: UpstreamCall, status: int, raw: bytes, sent_at: datetime) -> Outcome:
    fault = upstream_fault(status, raw, route=f"POST {_path(call.url)}")
    await respond(call.send, status, fault.body(), call.extra_headers)
    return Outcome(http_status=status, status="error", sent_at=sent_at, error=fault.recorded())


def _path(url: str) -> str:
    return "/" + url.split("://", 1)[-1].partition("/")[2]


async def call_unary(call: UpstreamCall) -> Outcome:
    resp, sent_at = await _open(call)
    try:
        if resp.status != 200:
            return await _relay_refusal(call, resp, sent_at)
        raw = await _read(resp)
        data = orjson.loads(raw)
        timings = call.engine.timings(data, resp.headers)
        if call.strip is not None and data.pop(call.strip, None) is not None:
            raw = orjson.dumps(data)
        await _answer_whole(call, resp, raw)
    finally:
        resp.release()
    outcome = Outcome(http_status=200, status="ok", sent_at=sent_at)
    outcome.usage = usage_normalized(data.get("usage") or {})
    outcome.timings = timings
    if timings.ttft_ms is not None:
        # The engine's TTFT runs from scheduling, after its queue time; its
        # clock may disagree a little with ours, and the token cannot be
        # later than the answer that carried it.
        queued = timings.queue_ms or 0
        outcome.first_token_at = min(
            sent_at + timedelta(milliseconds=float(queued + timings.ttft_ms)),  # ok-float: a clock
            now(),
        )
    return outcome


async def call_stream(
    call: UpstreamCall,
    *,
    client_wants_usage: bool,
    client_wants_continuous_usage: bool,
    disconnected: Gone,
) -> Outcome:
    resp, sent_at = await _open(call)
    try:
        if resp.status != 200:
            return await _relay_refusal(call, resp, sent_at)
        outcome = await _relay(
            resp,
            call,
            sent_at,
            keep_final_usage=client_wants_usage,
            keep_chunk_usage=client_wants_continuous_usage,
            disconnected=disconnected,
        )
    finally:
        # Kept alive if it ended; on an abort the connection is closed, and
        # the engine aborts the request.
        resp.release()
    return _prompt_to_count(call, outcome)


def _prompt_to_count(call: UpstreamCall, outcome: Outcome) -> Outcome:
    if call.counted_by is not None and "prompt_tokens" not in outcome.usage:
        outcome.prompt_uncounted = call
    return outcome


async def _relay(
    resp: UpstreamResponse,
    call: UpstreamCall,
    sent_at: datetime,
    *,
    keep_final_usage: bool,
    keep_chunk_usage: bool,
    disconnected: Gone,
) -> Outcome:
    """Relay a stream as it comes. Where its usage comes only at its end
    (the Responses API, an engine without usage on every chunk), its output
    so far is counted by its text events (call.counted_by)."""
    send, extra_headers, on_output, cut = call.send, call.extra_headers, call.on_output, call.cut
    counted_by = call.counted_by
    wants_id = call.engine.perf_metrics_path is not None  # TensorRT-LLM's timings, by it
    # The engine's extension (Dynamo's nvext): its last event has the timings.
    extension = call.engine.extension and f'"{call.engine.extension[0]}"'.encode()
    extension_event = b""
    outcome = Outcome(http_status=200, status="ok", sent_at=sent_at)
    last_usage_event = b""
    deltas = 0
    started = False
    pending = b""
    try:
        async for chunk in resp.chunks():
            if outcome.first_token_at is None:
                outcome.first_token_at = now()
            pending += chunk
            complete, sep, pending = pending.rpartition(EVENT_END)
            if not sep:
                pending = complete
                continue
            out = complete + EVENT_END
            if counted_by is not None:
                deltas += len(counted_by.findall(out))
                if on_output is not None:
                    on_output(deltas)
            if wants_id and not outcome.engine_id:
                found = CHUNK_ID.search(out)
                outcome.engine_id = found.group(1).decode() if found else ""
            if extension and extension in out:
                extension_event = last_event_with(out, extension) or extension_event
                if call.strip is not None:
                    out = extension_removed(out, call.strip)
            if USAGE_OBJECT.search(out):
                last_usage_event = usage_event_last(out) or last_usage_event
                if on_output is not None:
                    counts = COMPLETION_TOKENS.findall(last_usage_event)
                    if counts:
                        on_output(int(counts[-1]))
                if not (keep_final_usage and keep_chunk_usage):
                    out = usage_as_requested(
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
    except (UpstreamError, TimeoutError) as exc:
        if cut is not None and cut.fired:
            pass  # we closed it
        elif not started:
            raise UpstreamUnavailable(describe(exc), connection_failed=True) from None
        else:
            outcome.status, outcome.http_status, outcome.error = "error", 502, describe(exc)
            await error_event_send(
                send, 502, f"the model server failed mid-stream: {outcome.error}", "upstream_failed"
            )
    _upstream_ended(outcome, cut)
    if cut is not None and cut.fired and outcome.status == "ok":
        refused = cut_outcome(outcome, cut)
        if not started:
            await respond_refused(send, refused, extra_headers)
            _usage_of(outcome, last_usage_event, call, resp, extension_event)
            return outcome
        await error_event_send(send, refused.status, refused.message, refused.code)
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
    _usage_of(outcome, last_usage_event, call, resp, extension_event)
    if counted_by is not None and not outcome.usage:  # ended before its usage: what it streamed
        outcome.usage = {"completion_tokens": deltas}
    return outcome


def _upstream_ended(outcome: Outcome, cut: Cut | None) -> None:
    ended = cut.fired_at if cut is not None and cut.fired_at is not None else now()
    # Never before what the record already says happened.
    outcome.upstream_ended_at = max(ended, outcome.first_token_at or ended, outcome.sent_at)


def _usage_of(
    outcome: Outcome,
    usage_event: bytes,
    call: UpstreamCall,
    resp: UpstreamResponse,
    extension_event: bytes = b"",
) -> None:
    """The stream's usage and the engine's timings, from the last event
    that carried usage (vLLM's metrics and NIM's stats ride on it), or
    the last that carried the engine's extension (Dynamo's nvext)."""
    if usage_event:
        data = orjson.loads(event_data(usage_event))
        response = data.get("response") if isinstance(data.get("response"), dict) else {}
        outcome.usage = usage_normalized(data.get("usage") or response.get("usage") or {})
        outcome.timings = call.engine.timings(data, resp.headers)
    if extension_event and (found := event_data(extension_event)) is not None:
        outcome.timings = call.engine.timings(orjson.loads(found), resp.headers)


async def call_collected(call: UpstreamCall, *, kind: str) -> Outcome:
    """A plain request sent upstream as a stream (`gateway.unstream`: one
    that may be cut while it runs, and must then be charged what it used,
    or one whose engine's timings are found by a stream's id): the chunks
    joined into the answer the engine would have given, or 402 if it was
    cut. Until the answer is sent nothing reached the client, so a
    replica failing meanwhile is UpstreamUnavailable, as for call_unary."""
    resp, sent_at = await _open(call)
    try:
        if resp.status != 200:
            return await _relay_refusal(call, resp, sent_at)
        outcome = Outcome(http_status=200, status="ok", sent_at=sent_at)
        answer = unstreamed(kind)
        failed: dict[str, Any] | None = None  # an error event: the engine failed the request
        pending = b""
        counted_by = call.counted_by
        deltas = 0  # text events: its output until its usage comes
        try:
            async for chunk in resp.chunks():
                if outcome.first_token_at is None:
                    outcome.first_token_at = now()
                complete, sep, pending = (pending + chunk).rpartition(EVENT_END)
                if not sep:
                    pending = complete
                    continue
                if counted_by is not None:
                    deltas += len(counted_by.findall(complete))
                for event in complete.split(EVENT_END):
                    raw_data = event_data(event)
                    if raw_data is not None:
                        data = orjson.loads(raw_data)
                        if "error" in data:
                            failed = data
                        elif data.get("type") == "error":  # the Responses API's
                            failed = {"error": data}
                        else:
                            answer.add(data)
                if call.on_output is not None:
                    if answer.usage:
                        call.on_output(answer.usage.get("completion_tokens") or 0)
                    elif counted_by is not None:
                        call.on_output(deltas)
        except (UpstreamError, TimeoutError) as exc:
            if call.cut is None or not call.cut.fired:
                raise UpstreamUnavailable(describe(exc), connection_failed=True) from None
        _upstream_ended(outcome, call.cut)
    finally:
        resp.release()
    outcome.usage = answer.usage or {}
    # The usage chunk's, or where the engine's extension carried them.
    outcome.timings = call.engine.timings({**answer.tail, **answer.extras}, resp.headers)
    if call.strip is not None:
        answer.extras.pop(call.strip, None)
    outcome.engine_id = str(answer.head.get("id") or "") if kind != "responses" else ""
    if counted_by is not None and not outcome.usage:  # cut before its usage: what it made
        outcome.usage = {"completion_tokens": deltas}
        outcome = _prompt_to_count(call, outcome)
    if call.cut is not None and call.cut.fired:
        await respond_refused(call.send, cut_outcome(outcome, call.cut), call.extra_headers)
        return outcome
    if failed is not None:
        code = (failed["error"] or {}).get("code") if isinstance(failed["error"], dict) else None
        status = code if isinstance(code, int) and 400 <= code < 600 else 500
        answered = await _answer_fault(call, status, orjson.dumps(failed), outcome.sent_at)
        outcome.status, outcome.http_status, outcome.error = "error", status, answered.error
        return outcome
    await respond(call.send, 200, orjson.dumps(answer.answer()), call.extra_headers)
    return outcome
