"""A stream that ended before its usage came (aborted, cut): its prompt
counted after the fact, by the replica's /tokenize for a Responses API
request, or as the gateway estimated it; the record says which."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import orjson

from gateway.outcome import Outcome
from gateway.payload import responses_messages
from gateway.upstream_http import UpstreamError

if TYPE_CHECKING:
    from gateway.upstream import UpstreamCall

ESTIMATED_PROMPT = (
    "prompt tokens estimated by the gateway: the engine gave no usage before it ended"
)
COUNTED_OUTPUT = (
    "output tokens counted by the chunks streamed: the engine gave no usage before it ended"
)


def note(outcome: Outcome, note: str) -> None:
    outcome.error = f"{outcome.error}; {note}" if outcome.error else note


async def prompt_counted(outcome: Outcome) -> Outcome:
    """A stream that ended before its usage came (aborted, cut): a
    Responses API request's prompt as vLLM's tokenizer counts it, or, when
    the replica cannot say or its engine has no such endpoint, as the
    gateway estimated it (never nothing: a prompt the engine read is
    billed), the record saying which. Asked once the request has given its
    replica back: the count is not its work."""
    call = outcome.prompt_uncounted
    if call is None:
        return outcome
    outcome.prompt_uncounted = None
    counted = None
    if call.kind == "responses" and call.engine.vllm_fields:
        counted = await _responses_prompt_tokens(call)
        if counted is None:
            note(
                outcome,
                "prompt tokens estimated by the gateway: the replica's /tokenize did not answer",
            )
    elif call.kind != "responses":
        note(outcome, f"{ESTIMATED_PROMPT}; {COUNTED_OUTPUT}")
    else:
        note(outcome, ESTIMATED_PROMPT)
    outcome.usage["prompt_tokens"] = call.prompt_tokens_estimate if counted is None else counted
    return outcome


async def _responses_prompt_tokens(call: UpstreamCall) -> int | None:
    """The prompt of a Responses API request, counted by the replica's
    /tokenize (its chat template applied, as vLLM renders the request);
    None if the replica cannot say."""
    payload = orjson.loads(call.body)
    base = call.url.rsplit("/v1/", 1)[0]
    ask = {
        "model": payload.get("model"),
        "messages": responses_messages(payload),
        "add_generation_prompt": True,
    }
    try:
        async with asyncio.timeout(10):
            resp = await call.session.request(
                "POST",
                f"{base}/tokenize",
                orjson.dumps(ask),
                [(b"content-type", b"application/json")],
                connect_timeout=10,
                read_timeout=10,
            )
            try:
                if resp.status == 200:
                    return int(orjson.loads(await resp.read())["count"])
            finally:
                resp.release()
    except (UpstreamError, TimeoutError, KeyError, ValueError, TypeError):
        pass
    return None
