"""Server-sent events as the replicas stream them, read and edited as
bytes (the hot path never parses JSON per chunk): the patterns that find
usage, output and ids in a block of events, and the edits that give the
client only the usage it asked for and none of an engine's extension it
did not."""

from __future__ import annotations

import re

EVENT_END = b"\n\n"
# Byte patterns, so the hot path never parses JSON per chunk. Whitespace
# tolerant: vLLM writes compact JSON, other OpenAI-compatible servers may not.
USAGE_OBJECT = re.compile(rb'"usage"\s*:\s*\{')
USAGE_ONLY = re.compile(rb'"choices"\s*:\s*\[\s*\]')
COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
# A Responses API event carrying generated text (output, reasoning, a tool
# call's arguments): one per token as vLLM streams them (stream interval 1).
OUTPUT_DELTA = re.compile(rb'"type"\s*:\s*"response\.[a-z_.]*delta"')
# A chunk's usage object (one level of nesting: prompt_tokens_details),
# written as an unrolled loop: about five times faster than an alternation
# tried at every byte (measured on vLLM's chunks, bench/gateway.py).
CHUNK_USAGE = re.compile(rb',\s*"usage"\s*:\s*\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')
# The same written compactly, as vLLM writes it: a pattern that starts with
# a long literal is looked for by a quick search, not tried at every comma.
COMPACT_CHUNK_USAGE = re.compile(rb',"usage":\{[^{}]*(?:\{[^{}]*\}[^{}]*)*\}')
# A chat or completion chunk carrying generated text: one per token as the
# engines stream them. How a stream is counted when its engine gives no
# usage on every chunk (its usage comes only at the end).
CONTENT_DELTA = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')
CHUNK_ID = re.compile(rb'"id"\s*:\s*"([^"]*)"')


def event_data(event: bytes) -> bytes | None:
    """The JSON of a server-sent event's data line (after an `event:` line,
    as the Responses API names its events), or None."""
    head, sep, data = event.partition(b"data: ")
    if not sep or (head and not head.endswith(b"\n")) or not data.startswith(b"{"):
        return None
    return data


def last_event_with(block: bytes, marker: bytes) -> bytes | None:
    """The block's last event holding `marker`."""
    at = block.rfind(marker)
    if at < 0:
        return None
    before = block.rfind(EVENT_END, 0, at)
    stop = block.find(EVENT_END, at)
    return block[0 if before < 0 else before + len(EVENT_END) : len(block) if stop < 0 else stop]


def extension_removed(block: bytes, name: str) -> bytes:
    """The block with every event's `name` object taken out (two levels
    of objects deep at most: Dynamo's nvext {worker_id: {..}, timing: {..}})."""
    pattern = _EXTENSIONS.get(name)
    if pattern is None:
        pattern = _EXTENSIONS[name] = re.compile(
            rb',\s*"' + re.escape(name.encode()) + rb'"\s*:\s*\{(?:[^{}]|\{[^{}]*\})*\}'
        )
    return pattern.sub(b"", block)


_EXTENSIONS: dict[str, re.Pattern] = {}


def usage_event_last(block: bytes) -> bytes | None:
    """The block's last event carrying a usage object, looked for from the
    end (most often its last event): the block is not split apart."""
    end = len(block)
    while (at := block.rfind(b'"usage"', 0, end)) >= 0:
        before = block.rfind(EVENT_END, 0, at)
        start = 0 if before < 0 else before + len(EVENT_END)
        stop = block.find(EVENT_END, at)
        event = block[start : len(block) if stop < 0 else stop]
        if event_data(event) is not None and USAGE_OBJECT.search(event):
            return event
        end = start
    return None


def chunk_usage_removed(block: bytes) -> bytes:
    block = COMPACT_CHUNK_USAGE.sub(b"", block)
    return CHUNK_USAGE.sub(b"", block) if b'"usage"' in block else block


def usage_as_requested(block: bytes, *, keep_final: bool, keep_chunks: bool) -> bytes:
    """The gateway always asks vLLM for usage on every chunk (to bill aborts);
    the client gets only what it asked for: the final usage-only chunk with
    include_usage, usage on content chunks with continuous_usage_stats.
    The block's events are edited in place, not split apart: a stream's
    blocks pass here chunk after chunk (the hot path)."""
    # The usage-only chunk is the stream's last before [DONE] (OpenAI's
    # stream_options): the block's last "choices", if anywhere.
    at = block.rfind(b'"choices"')
    final = USAGE_ONLY.match(block, at) if at >= 0 else None
    if final is None:  # content chunks only (all but the stream's end)
        return block if keep_chunks else chunk_usage_removed(block)
    start = block.rfind(EVENT_END, 0, final.start())
    start = 0 if start < 0 else start + len(EVENT_END)
    end = block.find(EVENT_END, final.end())
    end = len(block) if end < 0 else end + len(EVENT_END)
    head, tail = block[:start], block[end:]
    if not keep_chunks:
        head, tail = chunk_usage_removed(head), chunk_usage_removed(tail)
    return head + (block[start:end] if keep_final else b"") + tail
