"""The relay tells the fair queue the output generated so far, chunk by
chunk, from the usage vLLM puts on every chunk, so a long request is
charged while it runs (gateway/fairness.py: Slot.progress)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gateway.proxy import UpstreamCall, UpstreamTimeouts, call_stream
from tests.gateway.fake_upstream import FakeUpstream


@pytest.fixture
def fake():
    upstream = FakeUpstream().start()
    yield upstream
    upstream.stop()


def relay(fake: FakeUpstream) -> tuple[list[int], list[dict], object]:
    seen: list[int] = []
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    async def go():
        async with aiohttp.ClientSession() as session:
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
                on_output=seen.append,
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
