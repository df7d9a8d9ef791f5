"""A request on a disaggregated pool: its prefill on a prefill replica, its
decode on a decode replica, as vLLM's disaggregated-serving proxy runs them
(examples/online_serving/disaggregated_serving): the prefill is asked for
one token, not streamed, with `kv_transfer_params` asking it to keep its KV
cache for a remote decode; the request itself then goes to the decode
replica with the `kv_transfer_params` the prefill answered (a connector
that moves KV by its own means, such as vLLM's ExampleConnector through
shared storage, answers none and finds it by the prompt).

With fair queuing, the prefill's slot is given back when the prefill ends
and the decode waits for a slot on a decode replica (each replica's
max_inflight holds on both sides).

The ledger gets a row per phase under the request's id, each with its own
replica, usage and timing: the prefill's (its prompt, and the one token it
made, which the client never sees) and the decode's (what the client got).
metering bills the request once from them (rollups). The client sees only
the decode's answer, or the prefill's refusal if it refused.

A decode replica that fails before answering is marked suspect and
another tried once; with none left the client gets 503 and the decode row
says why. The prefill is never run twice for one request."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import orjson

from gateway.errors import Refused
from gateway.fairness import Slot
from gateway.fleet import ReplicaInfo
from gateway.payload import PATHS, Prepared
from gateway.proxy import (
    Cut,
    Outcome,
    UpstreamCall,
    UpstreamUnavailable,
    call_unary,
    cut_outcome,
    now,
    respond_refused,
)
from gateway.queueing import ClientGone, ClientWatch, QueueWait
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
    slot: Slot | None = None  # its fair-queue slot on the prefill replica


async def disaggregated(
    gw: Gateway,
    hop: Hop,
    prefill: ReplicaInfo,
    *,
    disconnected: ClientWatch,
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
        first = Outcome(http_status=200, status="ok", sent_at=now())
        first.upstream_ended_at = cut.fired_at
        await respond_refused(hop.send, cut_outcome(first, cut), [hop.rid_header])
        return first
    record = hop.record
    if first.http_status != 200:  # the client's to know (a 4xx): the request ends here
        for message in captured:
            await hop.send(message)
        return first
    prefill_row = replace(record, phase=Phase.PREFILL, gateway_queue_ms=None)
    # Observed once, as a request: by its decode.
    await gw.record_outcome(prefill_row, hop.caller, first, observe=False)
    # What the request's spend settles to: the prefill's prompt, not the
    # decode's (which it read as KV cache), as the ledger bills it.
    hop.prepared.prefill_prompt = (prefill_row.prompt_tokens, prefill_row.cached_tokens)
    kv_transfer_params = _kv_transfer_params(captured)

    record.phase = Phase.DECODE
    record.replica_id, record.pool_id = decoders[0].id, decoders[0].pool_id
    decode_slot = None
    if hop.slot is not None:
        # Fair queuing: the prefill's slot back (its prompt charged), and a
        # slot on a decode replica, so that each replica's max_inflight holds.
        hop.slot.release(0, prefill_row.prompt_tokens)
        decode_slot = await _decode_slot(gw, hop, decoders, disconnected)
        if not isinstance(decode_slot, Slot):
            return decode_slot  # refused or gone: answered and said
        decoders = [d for d in decoders if d.id == decode_slot.replica_id]
    last_error = ""
    outcome: Outcome | None = None
    try:
        for decoder in decoders[:2]:
            record.replica_id, record.pool_id = decoder.id, decoder.pool_id
            gw.router.acquire(decoder)
            try:
                outcome = await gw.upstream(
                    hop.send, hop.kind, hop.prepared, record, hop.rid_header, decoder,
                    disconnected, decode_slot.progress if decode_slot else None, cut,
                    body=lambda engine, *, as_stream: hop.prepared.decode_body(
                        engine, kv_transfer_params, as_stream=as_stream
                    ),
                )  # fmt: skip
                return outcome
            except UpstreamUnavailable as exc:
                last_error = f"{decoder.name}: {exc}"
                gw.router.mark_suspect(decoder)
            finally:
                gw.router.release(decoder)
    finally:
        if decode_slot is not None:  # charged what it made (nothing, if it never ran)
            decode_slot.release((outcome.usage if outcome else {}).get("completion_tokens") or 0)
    message = f"no decode replica could take the request after its prefill ({last_error})"
    return await _refused(hop, first, Refused(503, "no_replica", message))


async def _decode_slot(
    gw: Gateway, hop: Hop, decoders: list[ReplicaInfo], disconnected: ClientWatch
) -> Slot | Outcome:
    """A fair-queue slot on one of the decode replicas (its prompt already
    charged by the prefill), or the outcome of waiting in vain."""
    wait = QueueWait(timeout=hop.caller.limits.queue_timeout_ms / 1000)
    try:
        slot = await gw.queue.slot(
            hop.caller,
            [d.id for d in decoders],
            own=[d.id for d in decoders if gw.router.is_own(d, hop.caller.tenant_id)],
            prompt_tokens=0,
            wait=wait,
            disconnected=disconnected,
        )
    except ClientGone:
        return Outcome(
            http_status=499,
            status="error",
            sent_at=now(),
            error="client disconnected while its decode was queued",
        )
    if isinstance(slot, Refused):
        return await _refused(hop, None, slot)
    return slot


async def _refused(hop: Hop, first: Outcome | None, refused: Refused) -> Outcome:
    """Its decode did not run: the client told, the decode row saying why."""
    await respond_refused(hop.send, refused, [hop.rid_header])
    return Outcome(
        http_status=refused.status,
        status="error",
        sent_at=(first.upstream_ended_at if first else None) or now(),
        error=f"{refused.code}: {refused.message}"[:300],
    )


def _kv_transfer_params(captured: list[dict]) -> Any:
    """The prefill answer's kv_transfer_params (None when it gave none)."""
    body = b"".join(m.get("body", b"") for m in captured if m["type"] == "http.response.body")
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return answer.get("kv_transfer_params") if isinstance(answer, dict) else None
