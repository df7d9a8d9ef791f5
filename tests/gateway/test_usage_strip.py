"""The gateway asks vLLM for usage on every chunk and gives the client only
the usage it asked for (gateway.upstream.usage_as_requested), editing a
relayed block of events in place: every combination, compact JSON as vLLM
writes it and spaced JSON as other servers may."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import (
    CHUNK_USAGE,
    EVENT_END,
    chunk_usage_removed,
    usage_as_requested,
    usage_event_last,
)

USAGE = {
    "prompt_tokens": 7,
    "completion_tokens": 2,
    "total_tokens": 9,
    "prompt_tokens_details": {"cached_tokens": 3},
}


def chunk(n: int, *, text: str) -> dict:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
        "usage": {**USAGE, "completion_tokens": n},
    }


def block(*, final: bool, spaced: bool) -> bytes:
    separators = (", ", ": ") if spaced else (",", ":")
    # Text that looks like usage JSON stays the client's text.
    events = [chunk(1, text='{"usage": {"x": 1}}'), chunk(2, text="b")]
    if final:
        events.append({"id": "chatcmpl-1", "choices": [], "usage": USAGE})
    out = b"".join(
        b"data: " + json.dumps(e, separators=separators).encode() + EVENT_END for e in events
    )
    return out + (b"data: [DONE]" + EVENT_END if final else b"")


def events_of(raw: bytes) -> list[dict | str]:
    out = []
    for event in raw.split(EVENT_END)[:-1]:
        data = event.removeprefix(b"data: ")
        out.append("[DONE]" if data == b"[DONE]" else json.loads(data))
    return out


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
@pytest.mark.parametrize("final", [False, True], ids=["content-block", "stream-end"])
@pytest.mark.parametrize(
    "keep_final,keep_chunks", [(False, False), (True, False), (False, True), (True, True)]
)
def test_the_client_gets_the_usage_it_asked_for(spaced, final, keep_final, keep_chunks):
    raw = block(final=final, spaced=spaced)
    out = events_of(usage_as_requested(raw, keep_final=keep_final, keep_chunks=keep_chunks))
    given = events_of(raw)

    content = [e for e in out if isinstance(e, dict) and e["choices"]]
    assert [e["choices"] for e in content] == [e["choices"] for e in given[:2]]
    assert content[0]["choices"][0]["delta"]["content"] == '{"usage": {"x": 1}}'
    if keep_chunks:
        assert [e["usage"]["completion_tokens"] for e in content] == [1, 2]
    else:
        assert all("usage" not in e for e in content)
        assert content[0] == {k: v for k, v in given[0].items() if k != "usage"}
    finals = [e for e in out if isinstance(e, dict) and not e["choices"]]
    assert finals == (
        [{"id": "chatcmpl-1", "choices": [], "usage": USAGE}] if final and keep_final else []
    )
    assert ("[DONE]" in out) == final


@pytest.mark.parametrize("spaced", [False, True], ids=["compact", "spaced"])
def test_a_blocks_usage_is_read_from_its_last_event_that_carries_one(spaced):
    """Usage is looked for from the block's end: an event after it whose
    usage is null (as servers without continuous usage write), [DONE], or
    usage-like text in the content does not hide it."""
    separators = (", ", ": ") if spaced else (",", ":")
    with_usage = b"data: " + json.dumps(chunk(2, text="a"), separators=separators).encode()
    null_usage = {**chunk(3, text='"usage": {"x": 1}'), "usage": None}
    raw = (
        with_usage
        + EVENT_END
        + b"data: "
        + json.dumps(null_usage, separators=separators).encode()
        + EVENT_END
        + b"data: [DONE]"
        + EVENT_END
    )
    assert usage_event_last(raw) == with_usage
    assert usage_event_last(raw[len(with_usage) + len(EVENT_END) :]) is None


usage_values = st.dictionaries(
    st.sampled_from(["prompt_tokens", "completion_tokens", "total_tokens", "reasoning_tokens"]),
    st.integers(0, 10**6),
)
usages = st.one_of(
    st.none(),
    usage_values,
    st.builds(
        lambda top, details: {**top, "prompt_tokens_details": details},
        usage_values,
        st.one_of(st.none(), usage_values),
    ),
)
# Braces, quotes and backslashes (escaped in JSON) and a non-ASCII letter.
texts = st.text(alphabet='ab{}":, \\\u00e9', max_size=20)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(
        st.tuples(texts, usages, st.one_of(st.none(), st.integers(0, 9))), min_size=1, max_size=6
    ),
    spaced=st.booleans(),
)
def test_chunk_usage_is_removed_exactly_as_the_pattern_removes_it(events, spaced):
    """The compact pattern first, the whitespace-tolerant one only where
    usage is left (the hot path), leave the same bytes as the tolerant
    pattern over the whole block: usage last or followed by another field,
    null usage, text that looks like usage or holds braces."""
    separators = (", ", ": ") if spaced else (",", ":")
    raw = b""
    for text, usage, after in events:
        event = {"id": "c", "choices": [{"index": 0, "delta": {"content": text}}], "usage": usage}
        if after is not None:
            event["after"] = after
        raw += b"data: " + json.dumps(event, separators=separators).encode() + EVENT_END
    stripped = chunk_usage_removed(raw)
    assert stripped == CHUNK_USAGE.sub(b"", raw)
    for (text, usage, _), event in zip(events, events_of(stripped), strict=True):
        assert event["choices"][0]["delta"]["content"] == text
        assert ("usage" in event) == (usage is None)


def test_a_usage_object_cut_short_is_left_as_it_came():
    raw = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":1,"details":{"a":1}'
    assert chunk_usage_removed(raw) == raw
