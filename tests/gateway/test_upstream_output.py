"""The relay tells the fair queue the output generated so far, chunk by
chunk, from the usage vLLM puts on every chunk, so a long request is
charged while it runs (gateway/fairness.py: Slot.progress)."""

from __future__ import annotations

import asyncio
import json

from gateway.errors import Refused
from gateway.outcome import Cut
from gateway.upstream import UpstreamCall, UpstreamTimeouts, call_stream
from gateway.upstream_http import UpstreamClient
from tests.gateway.fake_upstream import FakeUpstream


def relay(fake: FakeUpstream, *, cut: Cut | None = None) -> tuple[list[int], list[dict], object]:
    seen: list[int] = []
    sent: list[dict] = []

    def on_output(tokens: int) -> None:
        seen.append(tokens)
        if cut is not None and not cut.fired:
            cut.fire(Refused(402, "insufficient_credit", "no credit left"))

    async def send(message: dict) -> None:
        sent.append(message)

    async def go():
        async with UpstreamClient(keepalive_seconds=4) as session:
            call = UpstreamCall(
                session=session,
                url=f"{fake.base_url}/v1/chat/completions",
                body=json.dumps(
                    {
                        "model": "tiny",
                        "messages": [{"role": "user", "content": "hi"}],
                        "stream": True,
                        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                    }
                ).encode(),
                request_id="r1",
                timeouts=UpstreamTimeouts(connect=2, first_byte=10, read=10),
                send=send,
                extra_headers=[],
                on_output=on_output,
                cut=cut,
            )
            return await call_stream(
                call,
                client_wants_usage=False,
                client_wants_continuous_usage=False,
                disconnected=asyncio.Event(),
            )

    outcome = asyncio.run(go())
    return seen, sent, outcome


def test_output_is_reported_chunk_by_chunk(fake):
    seen, _, outcome = relay(fake)
    assert seen[:3] == [1, 2, 3]  # each content chunk's running count
    assert seen[-1] == outcome.usage["completion_tokens"]
    assert seen == sorted(seen)


def test_a_stream_cut_mid_way_has_reported_what_was_generated(fake):
    fake.mode = "drop_midstream"
    seen, _, outcome = relay(fake)
    assert outcome.status == "error"
    assert seen == [1, 2, 3]


def test_a_cut_request_ends_for_the_ledger_when_it_was_cut(fake):
    """Its GPU time ends when the gateway closed its upstream, not when the
    relay got round to finishing the client's answer."""
    fake.chunk_seconds = 0.2
    cut = Cut()
    seen, sent, outcome = relay(fake, cut=cut)
    assert seen == [1]  # cut at its first token: nothing more was read
    assert (outcome.status, outcome.http_status) == ("aborted", 402)
    assert outcome.upstream_ended_at == cut.fired_at
    assert outcome.first_token_at <= outcome.upstream_ended_at
    assert b"insufficient_credit" in sent[-2]["body"]


def test_a_finished_request_ends_when_its_last_chunk_was_read(fake):
    _, _, outcome = relay(fake)
    assert outcome.status == "ok"
    assert outcome.first_token_at <= outcome.upstream_ended_at


def test_an_aborted_response_whose_prompt_the_replica_cannot_count_bills_the_estimate():
    """A Responses API stream that ends before its usage: the prompt is
    counted by the replica's /tokenize, and when that does not answer (here
    nothing listens), by the gateway's own estimate, said on the record:
    never billed as no prompt at all."""
    from django.utils import timezone

    from core.processes import free_port
    from gateway.outcome import Outcome
    from gateway.prompt_count import prompt_counted

    async def go():
        async with UpstreamClient(keepalive_seconds=4) as session:
            call = UpstreamCall(
                session=session,
                url=f"http://127.0.0.1:{free_port()}/v1/responses",
                body=json.dumps({"model": "m", "input": "hello there"}).encode(),
                request_id="r",
                timeouts=UpstreamTimeouts(connect=1, first_byte=1, read=1),
                send=None,
                extra_headers=[],
                kind="responses",
                prompt_tokens_estimate=42,
            )
            aborted = Outcome(499, "aborted", timezone.now(), usage={"completion_tokens": 7})
            aborted.prompt_uncounted = call
            return await prompt_counted(aborted)

    outcome = asyncio.run(go())
    assert outcome.usage == {"completion_tokens": 7, "prompt_tokens": 42}
    assert "estimated by the gateway" in outcome.error
