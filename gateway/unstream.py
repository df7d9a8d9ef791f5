"""A plain (non-streaming) answer put together from an engine's stream of
chunks.

A request the gateway may have to stop while it runs (its GPU-second grant
not renewed, gateway.spend) goes upstream as a stream, whatever the client
asked, so that what it used is known to the token when it is stopped; a
client that asked for a plain answer gets this, what vLLM would have
answered: per choice, the deltas' content, reasoning and tool calls
joined (a tool call's arguments arrive in pieces, by index), log
probabilities concatenated, the last finish and stop reasons, and the
final usage. Text is kept as its pieces and joined once, at the answer:
adding each piece to the text so far would copy it again at every token."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

CHAT_LOGPROB_LISTS = ("content", "refusal")
TEXT_FIELDS = ("content", "reasoning_content", "refusal")  # a chat delta's text
TEXT_LOGPROB_LISTS = ("tokens", "token_logprobs", "top_logprobs", "text_offset")
# Where engines put a request's timings in a chunk: vLLM's, NIM's, Dynamo's.
TIMING_FIELDS = ("metrics", "stats", "nvext")


def unstreamed(kind: str) -> Unstreamed | UnstreamedResponse:
    return UnstreamedResponse() if kind == "responses" else Unstreamed(kind)


class UnstreamedResponse:
    """A Responses API stream ends with `response.completed`, which holds
    the whole response vLLM would have answered: that is the answer."""

    def __init__(self) -> None:
        self.response: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.tail: dict[str, Any] = {}  # the event that carried the usage

    def add(self, event: dict[str, Any]) -> None:
        response = event.get("response")
        if isinstance(response, dict):
            self.response = response  # the latest state: completed, or as far as it got
            if response.get("usage"):
                self.usage = usage_normalized(response["usage"])
                self.tail = event

    def answer(self) -> dict[str, Any]:
        return self.response or {}


def usage_normalized(usage: dict[str, Any]) -> dict[str, Any]:
    """A usage block as the gateway records it (chat's names), from either
    API's: the Responses API names them input_tokens / output_tokens."""
    if "input_tokens" not in usage and "output_tokens" not in usage:
        return usage
    details = usage.get("input_tokens_details") or {}
    return {
        "prompt_tokens": usage.get("input_tokens") or 0,
        "completion_tokens": usage.get("output_tokens") or 0,
        "prompt_tokens_details": {"cached_tokens": details.get("cached_tokens") or 0},
    }


class Unstreamed:
    def __init__(self, kind: str) -> None:
        self.chat = kind == "chat"
        self.head: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None
        # The chunk that carried the usage, where engines put their timings
        # (vLLM's metrics, NIM's stats), which the answer keeps.
        self.tail: dict[str, Any] = {}
        self.extras: dict[str, Any] = {}
        # Text by where it goes: (choice, field) or (choice, call, "name" |
        # "arguments") -> its pieces, joined by answer().
        self.pieces: defaultdict[tuple, list[str]] = defaultdict(list)

    def add(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {
                k: chunk[k] for k in ("id", "created", "model", "system_fingerprint") if k in chunk
            }
        for delta in chunk.get("choices") or ():
            self._choice(delta)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.tail = chunk
        for name in TIMING_FIELDS:
            if chunk.get(name):
                self.extras[name] = chunk[name]

    def _choice(self, piece: dict[str, Any]) -> None:
        index = piece.get("index", 0)
        choice = self.choices.get(index)
        if choice is None:
            choice = self.choices[index] = {"index": index, "logprobs": None}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": None, "tool_calls": []}
            else:
                choice["text"] = ""
        if self.chat:
            _merge_delta(choice["message"], piece.get("delta") or {}, self.pieces, index)
        elif piece.get("text"):
            self.pieces[index, "text"].append(piece["text"])
        if piece.get("logprobs"):
            lists = CHAT_LOGPROB_LISTS if self.chat else TEXT_LOGPROB_LISTS
            held = choice["logprobs"] = choice["logprobs"] or {}
            for name in lists:
                if piece["logprobs"].get(name) is not None:
                    if held.get(name) is None:
                        held[name] = []
                    held[name].extend(piece["logprobs"][name])
        for name in ("finish_reason", "stop_reason"):
            if piece.get(name) is not None or name not in choice:
                choice[name] = piece.get(name)

    def answer(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            **self.head,
            "object": "chat.completion" if self.chat else "text_completion",
            "choices": [self._joined(i) for i in sorted(self.choices)],
            "usage": self.usage,
        }
        return out | self.extras

    def _joined(self, index: int) -> dict[str, Any]:
        choice, pieces = self.choices[index], self.pieces
        if not self.chat:
            return {**choice, "text": "".join(pieces.get((index, "text"), ()))}
        message = dict(choice["message"])
        for name in TEXT_FIELDS:
            if (index, name) in pieces:
                message[name] = "".join(pieces[index, name])
        message["tool_calls"] = [
            {
                **call,
                "function": {
                    part: "".join(pieces.get((index, n, part), ()))
                    for part in ("name", "arguments")
                },
            }
            for n, call in enumerate(message["tool_calls"])
        ]
        return {**choice, "message": message}


def _merge_delta(
    message: dict[str, Any], delta: dict[str, Any], pieces: dict[tuple, list[str]], index: int
) -> None:
    if delta.get("role"):
        message["role"] = delta["role"]
    for name in TEXT_FIELDS:
        if delta.get(name) is not None:
            pieces[index, name].append(delta[name])
    for call in delta.get("tool_calls") or ():
        calls = message["tool_calls"]
        at = call.get("index", len(calls))
        while len(calls) <= at:
            calls.append(
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
            )
        held = calls[at]
        for name in ("id", "type"):
            if call.get(name):
                held[name] = call[name]
        function = call.get("function") or {}
        for part in ("name", "arguments"):
            if function.get(part):
                pieces[index, at, part].append(function[part])
