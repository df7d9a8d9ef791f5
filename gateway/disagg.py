"""A request on a disaggregated pool: its prefill on a prefill replica, its
decode on a decode replica, as vLLM's disaggregated-serving proxy runs them
(examples/online_serving/disaggregated_serving): the prefill is asked for
one token, not streamed, with `kv_transfer_params` asking it to keep its KV
cache for a remote decode; the request itself then goes to the decode
replica with the `kv_transfer_params` the prefill answered (a connector
that moves KV by its own means, such as vLLM's ExampleConnector through
shared storage, answers none and finds it by the prompt).

The ledger gets a row per phase under the request's id, each with its own
replica, usage and timing: the prefill's (its prompt, and the one token it
made, which the client never sees) and the decode's (what the client got).
metering bills the request once from them (rollups). The client sees only
the decode's answer, or the prefill's refusal if it refused.

A decode replica that fails before answering is marked suspect and
another tried once; with none left the client gets 503 and the decode row
says why. The prefill is never run twice for one request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson
from django.utils import timezone

from gateway.errors import Refused
from gateway.fleet import ReplicaInfo
from gateway.payload import PATHS, Prepared
from gateway.proxy import (
    Cut,
    Outcome,
    UpstreamCall,
    UpstreamUnavailable,
    call_unary,
    cut_outcome,
    respond_refused,
)
from metering.choices import Phase
from serving.engines import engine_spec
from serving.records import CompletedRequest

if TYPE_CHECKING:
    from gateway.app import Gateway
    from gateway.callers import Caller


@dataclass(frozen=True)
class Hop:
    """The request as one attempt carries it."""

    send: Callable
    kind: str
    caller: Caller
    prepared: Prepared
    record: CompletedRequest
    rid_header: tuple[bytes, bytes]


async def disaggregated(
    gw: Gateway,
    hop: Hop,
    prefill: ReplicaInfo,
    *,
    disconnected: asyncio.Event,
    on_output: Callable[[int], None] | None,
    cut: Cut | None,
) -> Outcome:
    """Prefill on `prefill`, then decode on its pool's decode replicas.
    UpstreamUnavailable (nothing ran, nothing was sent) when the pool has
    no decode replica or the prefill replica does not answer."""
    decoders = gw.router.decode_candidates(prefill)
    if not decoders:
        raise UpstreamUnavailable(
            "no decode replica in its pool", connection_failed=False, replica_fault=False
        )
    captured: list[dict] = []

    async def keep(message: dict) -> None:
        captured.append(message)

    engine = engine_spec(prefill.engine)
    call = UpstreamCall(
        session=gw.session,
        url=prefill.base_url + PATHS[hop.kind],
        body=hop.prepared.prefill_body(engine),
        request_id=hop.record.request_id,
        timeouts=gw.timeouts,
        send=keep,
        extra_headers=[hop.rid_header],
        cut=cut,
        kind=hop.kind,
        prompt_tokens_estimate=hop.prepared.prompt_tokens_estimate,
        engine=engine,
    )
    try:
        first = await call_unary(call)
    except UpstreamUnavailable:
        if cut is None or not cut.fired:
            raise
        # Its spend ran out during the prefill (we closed it): the client's
        # 402, recorded as the prefill's, as any request cut while it runs.
        first = Outcome(http_status=200, status="ok", sent_at=timezone.now())
        first.upstream_ended_at = cut.fired_at
        await respond_refused(hop.send, cut_outcome(first, cut), [hop.rid_header])
        return first
    record = hop.record
    if first.http_status != 200:  # the client's to know (a 4xx): the request ends here
        for message in captured:
            await hop.send(message)
        return first
    prefill_row = replace(record, phase=Phase.PREFILL, gateway_queue_ms=None, extra={})
    await gw.record_outcome(prefill_row, hop.caller, first)
    # What the request's spend settles to: the prefill's prompt, not the
    # decode's (which it read as KV cache), as the ledger bills it.
    record.extra["prefill_prompt"] = (prefill_row.prompt_tokens, prefill_row.cached_tokens)
    kv_transfer_params = _kv_transfer_params(captured)

    record.phase = Phase.DECODE
    last_error = ""
    for decoder in decoders[:2]:
        record.replica_id, record.pool_id = decoder.id, decoder.pool_id
        gw.router.acquire(decoder)
        try:
            return await gw._upstream(
                hop.send, hop.kind, hop.prepared, record, hop.rid_header, decoder, disconnected,
                on_output, cut,
                body=lambda engine, *, as_stream: hop.prepared.decode_body(
                    engine, kv_transfer_params, as_stream=as_stream
                ),
            )  # fmt: skip
        except UpstreamUnavailable as exc:
            last_error = f"{decoder.name}: {exc}"
            gw.router.mark_suspect(decoder)
        finally:
            gw.router.release(decoder)
    message = f"no decode replica could take the request after its prefill ({last_error})"
    await respond_refused(hop.send, Refused(503, "no_replica", message), [hop.rid_header])
    return Outcome(
        http_status=503,
        status="error",
        sent_at=first.upstream_ended_at or timezone.now(),
        error=message[:300],
    )


def _kv_transfer_params(captured: list[dict]) -> Any:
    """The prefill answer's kv_transfer_params (None when it gave none)."""
    body = b"".join(m.get("body", b"") for m in captured if m["type"] == "http.response.body")
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return answer.get("kv_transfer_params") if isinstance(answer, dict) else None
