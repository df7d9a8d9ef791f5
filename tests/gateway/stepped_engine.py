"""A fake vLLM whose step time is the test's to set: a scheduler loop that
runs up to `max_num_seqs` requests at once, one token each a step, a step
taking `step_ms(batch)`: flat up to `flat_until`, then growing with the
batch (a GPU's shape), times `slowdown` (a neighbour on its core). Its
/metrics say what vLLM's do for the adaptive concurrency controller: the
inter-token latency histogram's sum and count, requests running and
waiting, preemptions. It also records the largest batch it ran since asked."""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from tests.gateway.fake_upstream import FakeUpstream

SCHEDULER = web.AppKey("scheduler", asyncio.Task)


class SteppedEngine(FakeUpstream):
    def __init__(self, *, base_ms: float = 20.0, flat_until: int = 8, max_num_seqs: int = 256):
        super().__init__()
        self.base_ms = base_ms
        self.flat_until = flat_until
        self.max_num_seqs = max_num_seqs
        self.slowdown = 1.0
        self.itl_sum = 0.0
        self.itl_count = 0
        self.batch_max = 0  # since reset_batch_max()
        self.waiting_told: list[int] = []  # requests waiting, as each /metrics read said
        self._running: list[dict] = []
        self._waiting: list[dict] = []
        self._wake: asyncio.Event | None = None

    def step_ms(self, batch: int) -> float:
        return self.base_ms * max(1.0, batch / self.flat_until) * self.slowdown

    def prefill_ms(self, joined: list[dict]) -> float:
        """What the requests joining this step add to it (none here)."""
        return 0.0

    def reset_batch_max(self) -> None:
        self.batch_max = 0

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/metrics", self._vllm_metrics)
        app.router.add_get("/health", self._health)
        app.on_startup.append(self._start_scheduler)

    async def _start_scheduler(self, app: web.Application) -> None:
        self._wake = asyncio.Event()
        app[SCHEDULER] = asyncio.get_running_loop().create_task(self._schedule())

    async def _schedule(self) -> None:
        while True:
            if not self._running and not self._waiting:
                self._wake.clear()
                await self._wake.wait()
            joined = []
            while self._waiting and len(self._running) < self.max_num_seqs:
                joined.append(self._waiting.pop(0))
                self._running.append(joined[-1])
            batch = len(self._running)
            self.batch_max = max(self.batch_max, batch)
            step = self.step_ms(batch) + self.prefill_ms(joined)
            await asyncio.sleep(step / 1000)
            self.itl_sum += step / 1000 * batch
            self.itl_count += batch
            for job in list(self._running):
                job["left"] -= 1
                job["tokens"].put_nowait(1)
                if job["left"] == 0:
                    self._running.remove(job)
                    job["tokens"].put_nowait(None)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append({"body": body})
        output = body.get("max_tokens") or 16
        job = {"left": output, "tokens": asyncio.Queue()}
        self._waiting.append(job)
        self._wake.set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        done = 0
        while await job["tokens"].get() is not None:
            done += 1
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "model": body["model"],
                "choices": [{"index": 0, "delta": {"content": "x"}, "finish_reason": None}],
                "usage": {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": 5 + done},
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        usage = {"prompt_tokens": 5, "completion_tokens": done, "total_tokens": 5 + done}
        final = {"id": "c", "object": "chat.completion.chunk", "model": body["model"]}
        final |= {"choices": [], "usage": usage}
        await response.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        return response

    async def _vllm_metrics(self, request: web.Request) -> web.Response:
        self.waiting_told.append(len(self._waiting))
        labels = '{engine="0",model_name="tiny-llama"}'
        return web.Response(
            text=(
                "# TYPE vllm:num_requests_running gauge\n"
                f"vllm:num_requests_running{labels} {len(self._running)}\n"
                "# TYPE vllm:num_requests_waiting gauge\n"
                f"vllm:num_requests_waiting{labels} {len(self._waiting)}\n"
                "# TYPE vllm:num_preemptions counter\n"
                f"vllm:num_preemptions_total{labels} 0\n"
                "# TYPE vllm:inter_token_latency_seconds histogram\n"
                "vllm:inter_token_latency_seconds_bucket"
                f'{{engine="0",model_name="tiny-llama",le="+Inf"}} {self.itl_count}\n'
                f"vllm:inter_token_latency_seconds_count{labels} {self.itl_count}\n"
                f"vllm:inter_token_latency_seconds_sum{labels} {self.itl_sum}\n"
            )
        )
