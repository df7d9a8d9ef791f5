"""A minimal OpenAI-compatible upstream that answers instantly (fixed
completion of N tokens, streamed or not), to find the gateway's own ceiling.
Run: python -m bench.fake_upstream --port 9000 --tokens 32"""

from __future__ import annotations

import argparse
import json

from aiohttp import web


def build_app(tokens: int) -> web.Application:
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": tokens,
        "total_tokens": 12 + tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    metrics = {"queue_time_ms": 0.01, "time_to_first_token_ms": 0.1, "generation_time_ms": 0.1}
    unary = json.dumps(
        {
            "id": "cmpl-fake",
            "object": "chat.completion",
            "model": "fake",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "x" * tokens},
                    "finish_reason": "length",
                }
            ],
            "usage": usage,
            "metrics": metrics,
        },
        separators=(",", ":"),
    ).encode()
    events = []
    for n in range(1, tokens + 1):
        chunk = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": "fake",
            "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
            "usage": {**usage, "completion_tokens": n, "total_tokens": 12 + n},
        }
        events.append(b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n")
    final = {
        "id": "c",
        "object": "chat.completion.chunk",
        "model": "fake",
        "choices": [],
        "usage": usage,
        "metrics": metrics,
    }
    events.append(b"data: " + json.dumps(final, separators=(",", ":")).encode() + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    streamed = b"".join(events)

    async def completion(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if b'"stream":true' in body:
            return web.Response(body=streamed, content_type="text/event-stream")
        return web.Response(body=unary, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completion)
    app.router.add_get("/health", lambda request: web.Response(text="ok"))
    return app


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    web.run_app(
        build_app(args.tokens), host="127.0.0.1", port=args.port, print=None, access_log=None
    )
