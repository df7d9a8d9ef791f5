"""Every error a tenant gets from the gateway has OpenAI's shape, as the
official openai client reads it (its exception class, `type`, `code`,
`param`): a model asked of an endpoint it does not serve is refused by the
gateway before any replica sees it, and what a replica answers in its own
shape (vLLM's validation errors, FastAPI's {"detail": "Not Found"}) is
translated, keeping its status and message. A request the gateway refused
is recorded as rejected and one a replica refused as an error, neither
with a token to bill."""

from __future__ import annotations

import openai
import pytest

from metering.models import UsageEvent
from serving.tiny_model import EMBEDDING_MODEL_NAME, MODEL_NAME
from tests.fleet import fleet_model, wait_for_records

HELLO = [{"role": "user", "content": "hello"}]


def _recorded(refused: openai.APIStatusError) -> UsageEvent:
    request_id = refused.response.headers["x-request-id"]
    return wait_for_records([request_id])[request_id]


def _billed_nothing(record: UsageEvent) -> None:
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (0, 0, 0)


def test_embeddings_of_a_chat_model_are_a_400_naming_the_model(fleet, fake):
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").embeddings.create(model=MODEL_NAME, input="hello")
    error = refused.value
    assert (error.status_code, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "model_not_supported",
        "model",
    )
    assert f"`{MODEL_NAME}`" in error.message and "/v1/chat/completions" in error.message
    assert fake.requests == []  # decided by the gateway: nothing reached a replica
    record = _recorded(error)
    assert (record.status, record.http_status, record.replica_id) == ("rejected", 400, None)
    assert record.model == MODEL_NAME and record.error == error.body["message"]
    _billed_nothing(record)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_or_a_response_of_an_embedding_model_is_a_400_naming_the_model(fleet, fake, stream):
    embedder = fleet_model(EMBEDDING_MODEL_NAME)
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared", model=embedder)
    fleet.ready()
    client = fleet.client("a")
    asks = [
        lambda: client.chat.completions.create(
            model=EMBEDDING_MODEL_NAME, messages=HELLO, stream=stream
        ),
        lambda: client.completions.create(model=EMBEDDING_MODEL_NAME, prompt="hi", stream=stream),
        lambda: client.responses.create(model=EMBEDDING_MODEL_NAME, input="hi", stream=stream),
    ]
    for ask in asks:
        with pytest.raises(openai.BadRequestError) as refused:
            ask()
        error = refused.value
        assert (error.type, error.code, error.param) == (
            "invalid_request_error",
            "model_not_supported",
            "model",
        )
        assert f"`{EMBEDDING_MODEL_NAME}` is an embedding model" in error.message
        assert "/v1/embeddings" in error.message
        record = _recorded(error)
        assert (record.status, record.http_status, record.replica_id) == ("rejected", 400, None)
        _billed_nothing(record)
    assert fake.requests == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_vllm_validation_error_is_openais_naming_the_field(fleet, fake, stream):
    """vLLM's own answer to "temperature": "hot" (type "Bad Request", code
    400, param "body.temperature", the message a Python repr), before a
    stream started or to a plain request."""
    fake.mode = "vllm_validation"
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").chat.completions.create(
            model=MODEL_NAME, messages=HELLO, temperature="hot", stream=stream
        )
    error = refused.value
    assert (error.status_code, error.type, error.code, error.param) == (
        400,
        "invalid_request_error",
        "invalid_type",
        "temperature",
    )
    assert error.body["message"] == (
        "Invalid 'temperature': Input should be a valid number, unable to parse string as a "
        "number (got 'hot')"
    )
    assert len(fake.requests) == 1
    record = _recorded(error)
    assert (record.status, record.http_status) == ("error", 400)
    assert record.replica_id == fleet.replicas["fake"].pk
    assert record.error.startswith("invalid_type: Invalid 'temperature'")
    _billed_nothing(record)


@pytest.mark.parametrize(
    ("mode", "ask"),
    [
        # FastAPI's JSON for a route the engine lacks, and aiohttp's plain text.
        ("not_found", lambda c: c.chat.completions.create(model=MODEL_NAME, messages=HELLO)),
        ("ok", lambda c: c.responses.create(model=MODEL_NAME, input="hi")),
    ],
)
def test_a_route_the_replica_lacks_is_a_404_in_openais_shape(fleet, fake, mode, ask):
    fake.mode = mode
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with pytest.raises(openai.NotFoundError) as refused:
        ask(fleet.client("a"))
    error = refused.value
    assert (error.type, error.code, error.param) == ("invalid_request_error", None, None)
    assert error.body["message"].startswith("the model server answered 404 Not Found to POST /v1/")
    record = _recorded(error)
    assert (record.status, record.http_status) == ("error", 404)
    _billed_nothing(record)


def test_a_refusal_in_vllms_older_shape_keeps_its_message(fleet, fake):
    # {"error": {"message": "bad", "type": "BadRequestError", "code": 400}}
    fake.mode = "bad_request"
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").chat.completions.create(model=MODEL_NAME, messages=HELLO)
    assert refused.value.body == {
        "message": "bad",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
