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
another tried once (through a slot of its own); with none left the client
gets 503 and the decode row says why. The prefill is never run twice for
one request.

It talks to the pipeline through `Dispatch`, what it needs of it, and
imports neither the pipeline nor the process."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Protocol

import orjson

from gateway.answers import respond_refused
from gateway.errors import Refused
from gateway.exchange import Exchange, Rejected
from gateway.fairness import Slot
from gateway.fleet import ReplicaInfo, Router
from gateway.outcome import Cut, Outcome, UpstreamUnavailable, cut_outcome, now
from gateway.queueing import ClientGone, QueueWait
from gateway.recording import Recording
from gateway.relay import Relay
from gateway.upstream import call_unary
from metering.choices import Phase
from serving.engines import EngineSpec, engine_spec


class Dispatch(Protocol):
    """What a disaggregated request asks of the gateway's pipeline: its
    routes, one attempt at a replica, a row for the ledger, and a slot."""

    router: Router
    relay: Relay
    recording: Recording

    async def slot(
        self,
        ex: Exchange,
        replicas: Sequence[ReplicaInfo],
        *,
        prompt_tokens: int,
        wait: QueueWait,
    ) -> Slot:
        """A slot on one of `replicas` (Rejected: the queue refused; ClientGone)."""
        ...


async def disaggregated(
    dispatch: Dispatch, ex: Exchange, prefill: ReplicaInfo, *, cut: Cut | None
) -> Outcome:
    """Prefill on `prefill`, then decode on its pool's decode replicas.
    UpstreamUnavailable (nothing ran, nothing was sent) when the pool has
    no decode replica or the prefill replica does not answer."""
    decoders = dispatch.router.decode_candidates(prefill)
    if not decoders:
        raise UpstreamUnavailable(
            "no decode replica in its pool", connection_failed=False, replica_fault=False
        )
    captured: list[dict] = []

    async def keep(message: dict) -> None:
        captured.append(message)

    engine = engine_spec(prefill.engine)
    body = ex.prepared.prefill_body(engine)
    call = dispatch.relay.call(ex, prefill, engine=engine, body=body, send=keep, cut=cut)
    try:
        first = await call_unary(call)
    except UpstreamUnavailable:
        if cut is None or not cut.fired:
            raise
        # Its spend ran out during the prefill (we closed it): the client's
        # 402, recorded as the prefill's, as any request cut while it runs.
        first = Outcome(http_status=200, status="ok", sent_at=now())
        first.upstream_ended_at = cut.fired_at
        await respond_refused(ex.send, cut_outcome(first, cut), [ex.rid_header])
        return first
    record = ex.record
    if first.http_status != 200:  # the client's to know (a 4xx): the request ends here
        for message in captured:
            await ex.send(message)
        return first
    prefill_row = replace(record, phase=Phase.PREFILL, gateway_queue_ms=None)
    # Observed once, as a request: by its decode.
    await dispatch.recording.outcome(prefill_row, ex.caller, first, observe=False)
    # What the request's spend settles to: the prefill's prompt, not the
    # decode's (which it read as KV cache), as the ledger bills it.
    ex.prefill_prompt = (prefill_row.prompt_tokens, prefill_row.cached_tokens)
    kv_transfer_params = _kv_transfer_params(captured)

    def decode_body(engine: EngineSpec, *, as_stream: bool) -> bytes:
        return ex.prepared.decode_body(engine, kv_transfer_params, as_stream=as_stream)

    record.phase = Phase.DECODE
    record.replica_id, record.pool_id = decoders[0].id, decoders[0].pool_id
    # The prefill's slot back (its prompt charged); the decode takes a slot
    # on a decode replica, so that each replica's max_inflight holds.
    ex.slot.release(0, prefill_row.prompt_tokens)
    wait = QueueWait(timeout=ex.caller.limits.queue_timeout_ms / 1000)
    last_error = ""
    tried: list[int] = []
    for _attempt in range(2):
        usable = [d for d in decoders if d.id not in tried]
        if not usable:
            break
        try:
            slot = await dispatch.slot(ex, usable, prompt_tokens=0, wait=wait)
        except ClientGone:
            return Outcome(
                http_status=499,
                status="error",
                sent_at=now(),
                error="client disconnected while its decode was queued",
            )
        except Rejected as rejected:
            return await _refused(ex, None, rejected.refused)
        decoder = next(d for d in usable if d.id == slot.replica_id)
        tried.append(decoder.id)
        record.replica_id, record.pool_id = decoder.id, decoder.pool_id
        outcome: Outcome | None = None
        dispatch.router.acquire(decoder)
        try:
            outcome = await dispatch.relay.upstream(
                ex, decoder, cut=cut, on_output=slot.output_counter, body=decode_body
            )
            return outcome
        except UpstreamUnavailable as exc:
            last_error = f"{decoder.name}: {exc}"
            dispatch.router.mark_suspect(decoder)
        finally:
            dispatch.router.release(decoder)
            # Charged what it made (nothing, if it never ran).
            slot.release((outcome.usage if outcome else {}).get("completion_tokens") or 0)
    message = f"no decode replica could take the request after its prefill ({last_error})"
    return await _refused(ex, first, Refused(503, "no_replica", message))


async def _refused(ex: Exchange, first: Outcome | None, refused: Refused) -> Outcome:
    """Its decode did not run: the client told, the decode row saying why."""
    await respond_refused(ex.send, refused, [ex.rid_header])
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
