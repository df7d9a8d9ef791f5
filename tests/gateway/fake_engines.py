"""Inference engines other than vLLM, each answering the way its own
documentation says it does (real vLLM is the integration test; the others
need GPUs or NVIDIA's containers). Each counts the tokens it served in its
own Prometheus metrics, so reconciliation can be tried against it.

Where each shape is documented:

- TensorRT-LLM (trtllm-serve): a stream's chunks carry `chatcmpl-<request
  id>`, a plain answer `chatcmpl-<uuid>`; usage on every chunk with
  stream_options.continuous_usage_stats, a final usage chunk with
  include_usage (tensorrt_llm/serve/openai_protocol.py, StreamOptions;
  openai_server.py, _ensure_stream_metadata). GET /perf_metrics answers,
  and forgets, the finished requests' timing_metrics in seconds of a steady
  clock (openai_server.py, get_perf_metrics; serve/_perf_metrics_schema.py).
  /prometheus/metrics: trtllm_prompt_tokens_total,
  trtllm_generation_tokens_total (tensorrt_llm/metrics/collector.py).
- NVIDIA NIM for LLMs: `stats` on the answer and on the stream's last
  chunk (docs.nvidia.com/nim/large-language-models/1.14.0/
  nim-per-request-metrics.html); /v1/metrics: prompt_tokens_total,
  generation_tokens_total (.../latest/observability.html).
- TGI: x-queue-time, x-inference-time (ms) and the rest on a plain answer
  only: a stream's headers leave before it runs (router/src/server.rs,
  generate_internal, generate_stream_internal); usage only with
  include_usage, no continuous usage (router/src/chat.rs); /metrics:
  tgi_request_input_length and tgi_request_generated_tokens histograms
  (docs/source/reference/metrics.md).
- SGLang: usage, continuous usage supported, no timing in the OpenAI API
  (python/sglang/srt/entrypoints/openai/protocol.py); /metrics:
  sglang:prompt_tokens_total, sglang:generation_tokens_total per tp_rank
  (python/sglang/srt/metrics/collector.py).
- Triton's OpenAI frontend: usage, include_usage only (StreamOptions has no
  continuous_usage_stats: python/openai/openai_frontend/schemas/openai.py);
  /metrics is Triton core's, which counts no tokens
  (docs/user_guide/metrics.md).
- Any OpenAI-compatible server: usage only, no metrics.

Engines other than vLLM refuse vLLM's own fields (priority, cache_salt) and
those without continuous usage refuse continuous_usage_stats, as a strict
server may: the gateway must not send them."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from aiohttp import web

from tests.gateway.fake_upstream import FakeUpstream

PROMPT_TOKENS, OUTPUT_TOKENS = 7, 3
# What every timed engine reports: 4 ms queued, first token 6 ms after
# scheduling, 20 ms from first token to last (TGI: 26 ms of inference).
QUEUE_S, TTFT_S, GENERATION_S = 0.004, 0.006, 0.020
NIM_STATS = {
    "type": "NIM LLM Model Stats",
    "version": "0.1.0",
    "llm_input_token_length": PROMPT_TOKENS,
    "llm_output_token_length": OUTPUT_TOKENS,
    "generation_time_in_ms": 26.0,  # its total processing: TTFT and generation
    "time_in_queue_in_ms": 4.0,
    "response_tokens": {
        "response_token_length": OUTPUT_TOKENS,
        "time_to_first_token_in_ms": 6.0,
        "token_to_token_time_in_ms": 10.0,
        "tokens_per_second": 100.0,
    },
}
TGI_HEADERS = {
    "x-compute-type": "1-nvidia-a100",
    "x-compute-time": "0.03",
    "x-compute-characters": "5",
    "x-total-time": "30",
    "x-validation-time": "0",
    "x-queue-time": "4",
    "x-inference-time": "26",
    "x-time-per-token": "8",
    "x-prompt-tokens": str(PROMPT_TOKENS),
    "x-generated-tokens": str(OUTPUT_TOKENS),
}
METRICS_PATHS = {
    "trtllm": "/prometheus/metrics",
    "nim": "/v1/metrics",
    "tgi": "/metrics",
    "sglang": "/metrics",
    "triton": "/metrics",
}
HEALTH_PATHS = {"nim": "/v1/health/ready", "triton": "/health/ready", "openai": "/v1/models"}
CONTINUOUS_USAGE = {"trtllm", "sglang"}


class FakeEngine(FakeUpstream):
    def __init__(self, engine: str) -> None:
        super().__init__()
        self.engine = engine
        self.served_prompt = self.served_output = 0
        self.perf: list[dict] = []  # TensorRT-LLM's finished requests, until read
        self.perf_lost = False  # someone else drains /perf_metrics first
        self.perf_served = True  # False: return_perf_metrics off (a 404)
        self.perf_reads = 0
        self._next_id = 100
        self._stopped = False

    def _routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._completion)
        app.router.add_post("/v1/completions", self._completion)
        if self.engine in METRICS_PATHS:
            app.router.add_get(METRICS_PATHS[self.engine], self._engine_metrics)
        app.router.add_get(HEALTH_PATHS.get(self.engine, "/health"), self._health)
        if self.engine == "trtllm":
            app.router.add_get("/perf_metrics", self._perf_metrics)

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            super().stop()

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    async def _perf_metrics(self, request: web.Request) -> web.Response:
        self.perf_reads += 1
        if not self.perf_served:
            raise web.HTTPNotFound()
        drained, self.perf = self.perf, []
        return web.json_response([] if self.perf_lost else drained)

    async def _answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        for name in ("priority", "cache_salt"):
            if name in body:
                return _refused(f"{name}: extra inputs are not permitted")
        options = body.get("stream_options") or {}
        if "continuous_usage_stats" in options and self.engine not in CONTINUOUS_USAGE:
            return _refused("stream_options.continuous_usage_stats: extra inputs are not permitted")
        if self.mode != "ok":
            return await super()._answer(request, body)
        chat = request.path.endswith("/chat/completions")
        output = body.get("max_tokens") if self.stream_as_asked else OUTPUT_TOKENS
        if not body.get("stream"):
            return self._whole(body, chat)
        return await self._stream(request, body, options, chat, output or OUTPUT_TOKENS)

    def _whole(self, body: dict, chat: bool) -> web.Response:
        self.served_prompt += PROMPT_TOKENS
        self.served_output += OUTPUT_TOKENS
        choice = {"index": 0, "finish_reason": "length"}
        choice |= {"message": {"role": "assistant", "content": "xxx"}} if chat else {"text": "xxx"}
        answer = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion" if chat else "text_completion",
            "model": body["model"],
            "choices": [choice],
            "usage": _usage(OUTPUT_TOKENS),
        }
        if self.engine == "nim":
            answer["stats"] = NIM_STATS
        headers = TGI_HEADERS if self.engine == "tgi" else {}
        return web.json_response(answer, headers=headers)

    async def _stream(
        self, request: web.Request, body: dict, options: dict, chat: bool, output: int
    ) -> web.StreamResponse:
        headers = {"Content-Type": "text/event-stream"}
        if self.engine == "tgi":
            headers |= {"x-compute-type": "1-nvidia-a100", "x-compute-characters": "5"}
        response = web.StreamResponse(headers=headers)
        await response.prepare(request)
        arrival = time.monotonic()
        request_id = self._next_id
        self._next_id += 1
        head = {
            "id": f"chatcmpl-{request_id}" if self.engine == "trtllm" else "chatcmpl-fake",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "model": body["model"],
        }
        continuous = options.get("continuous_usage_stats") and self.engine in CONTINUOUS_USAGE
        # TensorRT-LLM's include_usage defaults to true once stream_options is sent.
        final_usage = options.get("include_usage", self.engine == "trtllm" and bool(options))
        self.served_prompt += PROMPT_TOKENS
        for n in range(1, output + 1):
            piece = {"delta": {"content": "x"}} if chat else {"text": "x"}
            chunk = head | {"choices": [{"index": 0, **piece, "finish_reason": None}]}
            if continuous:
                chunk["usage"] = _usage(n)
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.served_output += 1
            await asyncio.sleep(self.chunk_seconds)
        if self.mode == "drop_midstream":
            request.transport.close()
            return response
        if final_usage:
            final = head | {"choices": [], "usage": _usage(output)}
            if self.engine == "nim":
                final["stats"] = NIM_STATS
            await response.write(f"data: {json.dumps(final)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        if self.engine == "trtllm":
            self.perf.append(_perf_entry(request_id, arrival))
        return response

    async def _engine_metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=self.metrics_text())

    def metrics_text(self) -> str:
        prompt, output = self.served_prompt, self.served_output
        label = 'model_name="tiny-llama"'
        if self.engine == "trtllm":
            return (
                "# TYPE trtllm_prompt_tokens_total counter\n"
                f'trtllm_prompt_tokens_total{{{label},engine_type="pytorch"}} {prompt}.0\n'
                "# TYPE trtllm_generation_tokens_total counter\n"
                f'trtllm_generation_tokens_total{{{label},engine_type="pytorch"}} {output}.0\n'
            )
        if self.engine == "nim":
            return (
                "# TYPE num_requests_running gauge\n"
                f"num_requests_running{{{label}}} 0.0\n"
                "# TYPE prompt_tokens_total counter\n"
                f"prompt_tokens_total{{{label}}} {prompt}.0\n"
                "# TYPE generation_tokens_total counter\n"
                f"generation_tokens_total{{{label}}} {output}.0\n"
            )
        if self.engine == "tgi":
            return (
                "# TYPE tgi_queue_size gauge\ntgi_queue_size 0\n"
                "# TYPE tgi_request_input_length histogram\n"
                f'tgi_request_input_length_bucket{{le="+Inf"}} {prompt // PROMPT_TOKENS}\n'
                f"tgi_request_input_length_sum {prompt}\n"
                f"tgi_request_input_length_count {prompt // PROMPT_TOKENS}\n"
                "# TYPE tgi_request_generated_tokens histogram\n"
                f'tgi_request_generated_tokens_bucket{{le="+Inf"}} {prompt // PROMPT_TOKENS}\n'
                f"tgi_request_generated_tokens_sum {output}\n"
                f"tgi_request_generated_tokens_count {prompt // PROMPT_TOKENS}\n"
            )
        if self.engine == "sglang":  # one series per tensor-parallel rank, the same
            ranks = ("0", "1")
            return "".join(
                f"# TYPE sglang:{name}_total counter\n"
                + "".join(
                    f'sglang:{name}_total{{{label},tp_rank="{rank}"}} {value}.0\n' for rank in ranks
                )
                for name, value in (("prompt_tokens", prompt), ("generation_tokens", output))
            )
        return (  # Triton core: requests, no tokens
            "# TYPE nv_inference_request_success counter\n"
            f'nv_inference_request_success{{model="tiny-llama",version="1"}} '
            f"{prompt // PROMPT_TOKENS}\n"
        )


def _usage(output: int) -> dict:
    return {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": output,
        "total_tokens": PROMPT_TOKENS + output,
    }


def _perf_entry(request_id: int, arrival: float) -> dict:
    scheduled = arrival + QUEUE_S
    first = scheduled + TTFT_S
    return {
        "request_id": request_id,
        "perf_metrics": {
            "first_iter": 1,
            "last_iter": 4,
            "timing_metrics": {
                "server_arrival_time": arrival,
                "arrival_time": arrival,
                "first_scheduled_time": scheduled,
                "first_token_time": first,
                "server_first_token_time": first,
                "last_token_time": first + GENERATION_S,
            },
            "kv_cache_metrics": {
                "num_total_allocated_blocks": 1,
                "num_new_allocated_blocks": 1,
                "num_reused_blocks": 0,
                "num_missed_blocks": 1,
            },
        },
    }


def _refused(message: str) -> web.Response:
    return web.json_response(
        {"object": "error", "message": message, "type": "BadRequestError", "code": 400},
        status=400,
    )
