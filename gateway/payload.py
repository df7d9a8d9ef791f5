"""Parsing and rewriting the client's request body before it goes to vLLM."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.callers import Caller
from gateway.fleet import FleetSnapshot

# Fields a client must not set: the gateway sets them per tenant.
GATEWAY_OWNED_FIELDS = ("priority", "cache_salt", "request_id", "kv_transfer_params")
PER_MESSAGE_OVERHEAD_TOKENS = 4


class BadRequest(Exception):
    def __init__(
        self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.code = code
        self.model = ""  # the model the client asked for, once the body named one


@dataclass
class Prepared:
    body: bytes  # what goes upstream
    model: str  # the public name the client asked for
    route_model: str  # the served model whose replicas can answer
    stream: bool
    client_wants_usage: bool  # the final usage chunk (stream_options.include_usage)
    client_wants_continuous_usage: bool  # usage on every chunk
    estimated_tokens: int  # prompt estimate + max_tokens: the in-flight budget charge
    prompt_tokens_estimate: int = 0  # the fair queue's charge at dispatch
    # Upper bounds, for the worst-case charge a budget reserves (issue 18):
    # the prompt's tokens (no more than its bytes plus the chat template, and
    # no more than the context less max_tokens, which vLLM enforces), the
    # output tokens of one choice (max_tokens, else the whole context) and
    # the choices (n, best_of).
    prompt_tokens_max: int = 0
    output_tokens_max: int = 0
    choices: int = 1


def prepare(
    raw: bytes, *, kind: str, caller: Caller, fleet: FleetSnapshot, default_max_tokens: int
) -> Prepared:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BadRequest("request body is not valid JSON") from None
    if not isinstance(payload, dict):
        raise BadRequest("request body must be a JSON object")

    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("'model' is required", param="model")
    try:
        return _prepare_for_model(
            payload,
            model=model,
            kind=kind,
            caller=caller,
            fleet=fleet,
            default_max_tokens=default_max_tokens,
        )
    except BadRequest as bad:
        bad.model = model  # a refused request is recorded under the name it asked for
        raise


def _prepare_for_model(
    payload: dict[str, Any],
    *,
    model: str,
    kind: str,
    caller: Caller,
    fleet: FleetSnapshot,
    default_max_tokens: int,
) -> Prepared:
    adapter = fleet.adapters.get(model)
    if adapter is not None:
        if adapter.tenant_id != caller.tenant_id:  # another tenant's adapter: not found
            raise _model_not_found(model)
        route_model, upstream_model = adapter.base_model, adapter.upstream_name
    elif model in fleet.models:
        route_model, upstream_model = model, model
    else:
        raise _model_not_found(model)

    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    max_tokens = _max_tokens(payload, kind)
    prompt_chars = _prompt_chars(payload, kind)
    info = fleet.models[route_model]
    prompt_estimate = int(prompt_chars / info.chars_per_token) + 1  # ok-float: estimate only
    budget_tokens = max_tokens if max_tokens is not None else default_max_tokens
    choices = _choices(payload)
    context = info.max_context_tokens
    prompt_tokens_max = max(1, min(context - (max_tokens or 0), 2 * prompt_chars + 64))

    for name in GATEWAY_OWNED_FIELDS:
        payload.pop(name, None)
    payload["model"] = upstream_model
    payload["priority"] = caller.priority
    payload["cache_salt"] = caller.cache_salt
    client_wants_usage = client_wants_continuous = False
    if stream:
        options = payload.get("stream_options") or {}
        if not isinstance(options, dict):
            raise BadRequest("'stream_options' must be an object", param="stream_options")
        client_wants_usage = bool(options.get("include_usage"))
        client_wants_continuous = bool(options.get("continuous_usage_stats"))
        # Usage on every chunk: a client that goes away mid-stream is billed
        # for the tokens generated up to its last chunk.
        payload["stream_options"] = {
            **options,
            "include_usage": True,
            "continuous_usage_stats": True,
        }
    return Prepared(
        body=orjson.dumps(payload),
        model=model,
        route_model=route_model,
        stream=stream,
        client_wants_usage=client_wants_usage,
        client_wants_continuous_usage=client_wants_continuous,
        estimated_tokens=prompt_estimate + budget_tokens,
        prompt_tokens_estimate=prompt_estimate,
        prompt_tokens_max=prompt_tokens_max,
        output_tokens_max=max_tokens if max_tokens is not None else context,
        choices=choices,
    )


def _model_not_found(model: str) -> BadRequest:
    return BadRequest(
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        status=404,
        code="model_not_found",
    )


def _max_tokens(payload: dict[str, Any], kind: str) -> int | None:
    names = ("max_completion_tokens", "max_tokens") if kind == "chat" else ("max_tokens",)
    for name in names:
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"'{name}' must be a positive integer", param=name)
        return value
    return None


def _choices(payload: dict[str, Any]) -> int:
    """How many completions the request asks for (n, best_of: at least 1)."""
    most = 1
    for name in ("n", "best_of"):
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"'{name}' must be a positive integer", param=name)
        most = max(most, value)
    return most


def _prompt_chars(payload: dict[str, Any], kind: str) -> int:
    if kind == "chat":
        messages = payload.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty array", param="messages")
        total = 0
        for message in messages:
            if not isinstance(message, dict):
                raise BadRequest("each message must be an object", param="messages")
            total += _content_chars(message.get("content")) + PER_MESSAGE_OVERHEAD_TOKENS
        return total
    prompt = payload.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.encode())
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return sum(len(p.encode()) for p in prompt)
        if all(isinstance(p, int) for p in prompt):
            return len(prompt) * 4  # token ids: about one token each at 4 chars/token
    raise BadRequest(
        "'prompt' must be a string or an array of strings or token ids", param="prompt"
    )


def _content_chars(content: Any) -> int:
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content.encode())
    if isinstance(content, list):  # content parts
        return sum(
            len(str(part.get("text", "")).encode()) for part in content if isinstance(part, dict)
        )
    return len(str(content).encode())
