"""Parsing and rewriting the client's request body before it goes to vLLM.

Four kinds of request: `chat` (/v1/chat/completions), `completion`
(/v1/completions), `responses` (/v1/responses, the OpenAI Responses API:
`input` and `instructions` for the prompt, `max_output_tokens` for the
output bound, usage named input_tokens / output_tokens) and `embeddings`
(/v1/embeddings: `input` only, no output tokens, never streamed)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.callers import Caller
from gateway.fleet import FleetSnapshot
from serving.choices import ModelTask
from serving.engines import EngineSpec

# The gateway's paths (the same on every engine) and the kind each serves.
ENDPOINTS = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completion",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
}
PATHS = {kind: path for path, kind in ENDPOINTS.items()}
# Fields a client must not set: the gateway sets them per tenant.
GATEWAY_OWNED_FIELDS = ("priority", "cache_salt", "request_id", "kv_transfer_params")
# Of those, what only vLLM takes (another engine may refuse a field it does not know).
VLLM_FIELDS = ("priority", "cache_salt")
# The fields that bound a request's output, per kind, the first one named wins.
OUTPUT_BOUND_FIELDS = {
    "chat": ("max_completion_tokens", "max_tokens"),
    "completion": ("max_tokens",),
    "responses": ("max_output_tokens",),
    "embeddings": (),  # nothing generated
}
GENERATING_KINDS = frozenset({"chat", "completion", "responses"})
# The served model's task (serving.choices.ModelTask) each kind needs: vLLM
# serves a generating model's routes or an embedding model's, never both.
KIND_TASKS = {
    "chat": ModelTask.GENERATE,
    "completion": ModelTask.GENERATE,
    "responses": ModelTask.GENERATE,
    "embeddings": ModelTask.EMBED,
}
TASK_NAMES = {ModelTask.GENERATE: "a text generation model", ModelTask.EMBED: "an embedding model"}
# What a disaggregated pool splits into prefill and decode (gateway.disagg).
DISAGGREGABLE_KINDS = frozenset({"chat", "completion"})
# vLLM's ask of a prefill replica: keep the KV cache for a decode elsewhere
# (examples/online_serving/disaggregated_serving, its toy proxy).
PREFILL_KV_TRANSFER = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
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
    # Upper bounds, for the worst-case charge a budget reserves:
    # the prompt's tokens (no more than its bytes plus the chat template, and
    # no more than the context less max_tokens, which vLLM enforces), the
    # output tokens of one choice (max_tokens, else the whole context) and
    # the choices (n, best_of).
    prompt_tokens_max: int = 0
    output_tokens_max: int = 0
    choices: int = 1
    max_tokens_field: str = "max_tokens"  # as the client named it (max_completion_tokens)
    kind: str = "chat"  # chat | completion | responses | embeddings
    hold: Any = None  # gateway.spend.Hold: the spend reservation, once the gateway made it
    # A disaggregated request's prompt and cached tokens as its prefill
    # counted them (gateway.disagg): what its spend settles to.
    prefill_prompt: tuple[int, int] | None = None

    @property
    def disaggregable(self) -> bool:
        """Whether a disaggregated pool may split it into prefill and decode."""
        return self.kind in DISAGGREGABLE_KINDS

    @property
    def generates(self) -> bool:
        """Whether it generates tokens (an embedding does not, nor streams)."""
        return self.kind in GENERATING_KINDS

    def upstream_body(self, engine: EngineSpec, *, as_stream: bool = False) -> bytes:
        """What goes to a replica of `engine`: vLLM's own fields (priority,
        cache_salt) to vLLM only, usage on every chunk where the engine gives
        it (else the final usage chunk). `as_stream`: a plain request asked
        as a stream (gateway.unstream), to be answered whole."""
        if engine.vllm_fields and not as_stream:
            return self.body  # as prepare made it, the hot path
        payload = orjson.loads(self.body)
        if not engine.vllm_fields:
            for name in VLLM_FIELDS:
                payload.pop(name, None)
        if engine.extension is not None:
            name, asked = engine.extension
            payload[name] = extension_merged(payload.get(name), asked)
        if as_stream:
            payload["stream"] = True
            payload.pop("stream_options", None)  # the client's were for a plain answer
        if payload.get("stream") and self.kind != "responses":  # whose stream ends with usage
            options = {**(payload.get("stream_options") or {}), "include_usage": True}
            if engine.continuous_usage:
                options["continuous_usage_stats"] = True
            else:
                options.pop("continuous_usage_stats", None)
            payload["stream_options"] = options
        return orjson.dumps(payload)

    def prefill_body(self, engine: EngineSpec) -> bytes:
        """The prefill half of a disaggregated request, as vLLM's
        disaggregated-serving proxy sends it: one token, not streamed, the
        KV cache kept for a remote decode."""
        payload = orjson.loads(self.upstream_body(engine))
        for name in (*OUTPUT_BOUND_FIELDS[self.kind], "min_tokens"):
            payload.pop(name, None)
        payload["max_tokens"] = 1
        payload["stream"] = False
        payload.pop("stream_options", None)
        payload["kv_transfer_params"] = PREFILL_KV_TRANSFER
        return orjson.dumps(payload)

    def decode_body(self, engine: EngineSpec, kv_transfer_params: Any, *, as_stream: bool) -> bytes:
        """The decode half: the request itself, with what the prefill said
        of its KV cache (none from a connector that finds it by the prompt)."""
        body = self.upstream_body(engine, as_stream=as_stream)
        if not kv_transfer_params:
            return body
        payload = orjson.loads(body)
        payload["kv_transfer_params"] = kv_transfer_params
        return orjson.dumps(payload)


def extension_merged(client: Any, asked: dict[str, Any]) -> dict[str, Any]:
    """What the client asked of an engine's extension, plus what the gateway
    asks (lists joined, the client's first)."""
    merged = dict(client) if isinstance(client, dict) else {}
    for key, value in asked.items():
        had = merged.get(key)
        if isinstance(value, list) and isinstance(had, list):
            merged[key] = list(dict.fromkeys([*had, *value]))
        elif had is None:
            merged[key] = value
    return merged


def extension_unasked(engine: EngineSpec, body: bytes) -> str | None:
    """The engine's extension when the gateway asks for it and the client's
    request (`body`) did not: what to take out of the answer."""
    if engine.extension is None:
        return None
    name = engine.extension[0]
    asked = f'"{name}"'.encode() in body and name in orjson.loads(body)
    return None if asked else name


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
    info = fleet.models[route_model]
    if info.task != KIND_TASKS[kind]:
        raise _model_not_supported(model, task=info.task, kind=kind)

    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("'stream' must be a boolean", param="stream")
    generates = kind in GENERATING_KINDS
    stream = stream and generates
    max_tokens_name, max_tokens = _max_tokens(payload, kind)
    prompt_chars = _prompt_chars(payload, kind)
    prompt_estimate = int(prompt_chars / info.chars_per_token) + 1  # ok-float: estimate only
    budget_tokens = max_tokens if max_tokens is not None else default_max_tokens * generates
    choices = _choices(payload)
    context = info.max_context_tokens
    if max_tokens is not None and max_tokens >= context:
        # vLLM would refuse it too, after it queued: the context holds the
        # prompt as well, so no prompt leaves room for this many.
        raise BadRequest(
            f"'{max_tokens_name}' ({max_tokens:,}) must be less than the model's context "
            f"window of {context:,} tokens, which holds the prompt as well",
            param=max_tokens_name,
        )
    # Each input of an embeddings batch is a prompt of its own (up to a
    # context each, and each with its special tokens).
    prompts = _embedding_inputs(payload) if kind == "embeddings" else 1
    prompt_tokens_max = max(
        1, min(prompts * (context - (max_tokens or 0)), 2 * prompt_chars + 64 * prompts)
    )

    for name in GATEWAY_OWNED_FIELDS:
        payload.pop(name, None)
    payload["model"] = upstream_model
    payload["priority"] = caller.priority
    payload["cache_salt"] = caller.cache_salt
    if payload.get("background"):
        # Answered at once and run later, out of the gateway's sight: neither
        # metered nor held to a budget.
        raise BadRequest(
            "'background' responses are not served by this gateway: stream instead",
            param="background",
        )
    client_wants_usage = client_wants_continuous = False
    if kind == "responses":
        # Its stream carries usage once, in response.completed, which the
        # client gets as vLLM sent it.
        client_wants_usage = client_wants_continuous = True
    elif stream:
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
        output_tokens_max=max_tokens if max_tokens is not None else context * generates,
        choices=choices,
        max_tokens_field=max_tokens_name,
        kind=kind,
    )


def _model_not_found(model: str) -> BadRequest:
    return BadRequest(
        f"The model `{model}` does not exist or you do not have access to it.",
        param="model",
        status=404,
        code="model_not_found",
    )


def _model_not_supported(model: str, *, task: str, kind: str) -> BadRequest:
    """A model asked of an endpoint its replicas do not serve: refused
    here, as OpenAI refuses an embedding model on chat (invalid_request_error,
    param `model`), but 400 with a code of its own: nothing is wrong with
    the name, only with the endpoint."""
    serves = ", ".join(path for path, k in ENDPOINTS.items() if KIND_TASKS[k] == task)
    return BadRequest(
        f"The model `{model}` is {TASK_NAMES.get(task, task)} and is not served on "
        f"{PATHS[kind]}: it is served on {serves}.",
        param="model",
        code="model_not_supported",
    )


def _max_tokens(payload: dict[str, Any], kind: str) -> tuple[str, int | None]:
    """The output bound the request names, and the field that named it."""
    names = OUTPUT_BOUND_FIELDS[kind]
    for name in names:
        value = payload.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise BadRequest(f"'{name}' must be a positive integer", param=name)
        return name, value
    return (names or ("max_tokens",))[-1], None


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
    if kind == "responses":
        return _responses_input_chars(payload)
    if kind == "embeddings":
        return _text_or_tokens_chars(payload.get("input"), "input")
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
    return _text_or_tokens_chars(payload.get("prompt"), "prompt")


def _content_chars(content: Any) -> int:
    return len(_content_text(content).encode())


def _content_text(content: Any) -> str:
    """A message's or input item's text: a string, or its parts' text."""
    if content is None:
        return ""
    if isinstance(content, list):  # content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _item_content(item: dict[str, Any]) -> Any:
    """A Responses API input item's content: a message's, or a tool call's
    output or arguments."""
    return item.get("content", item.get("output", item.get("arguments")))


def _responses_input_chars(payload: dict[str, Any]) -> int:
    """`instructions` and `input`: a string, or a list of items (messages
    with string or part content, tool outputs)."""
    instructions = payload.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", param="instructions")
    total = len((instructions or "").encode())
    items = payload.get("input")
    if isinstance(items, str) and items:
        return total + len(items.encode()) + PER_MESSAGE_OVERHEAD_TOKENS
    if not isinstance(items, list) or not items:
        raise BadRequest("'input' must be a non-empty string or array of items", param="input")
    for item in items:
        if not isinstance(item, dict):
            raise BadRequest("each input item must be an object", param="input")
        total += _content_chars(_item_content(item)) + PER_MESSAGE_OVERHEAD_TOKENS
    return total


CHAT_ROLES = frozenset({"system", "developer", "user", "assistant"})


def responses_messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """A Responses API request's prompt as chat messages (instructions as
    the system message, then each input item's text), as vLLM renders it:
    for counting its tokens with /tokenize when its usage never came."""
    messages = []
    if payload.get("instructions"):
        messages.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or ():
        role = item.get("role")
        text = _content_text(_item_content(item))
        messages.append({"role": role if role in CHAT_ROLES else "user", "content": text})
    return messages


def _text_or_tokens_chars(value: Any, param: str) -> int:
    """A completion's `prompt` or an embedding's `input`: a string, strings,
    token ids, or arrays of token ids (a token id counted as 4 characters,
    about one token at 4 characters a token)."""
    if isinstance(value, str) and value:
        return len(value.encode())
    if isinstance(value, list) and value:
        if all(isinstance(v, str) for v in value):
            return sum(len(v.encode()) for v in value)
        if all(isinstance(v, int) for v in value):
            return len(value) * 4
        if all(isinstance(v, list) and all(isinstance(t, int) for t in v) for v in value):
            return sum(len(v) for v in value) * 4
    raise BadRequest(
        f"'{param}' must be a non-empty string, array of strings, or token ids", param=param
    )


def _embedding_inputs(payload: dict[str, Any]) -> int:
    """How many prompts an embeddings request holds (`input` already checked)."""
    items = payload["input"]
    if isinstance(items, str) or all(isinstance(i, int) for i in items):
        return 1
    return len(items)
