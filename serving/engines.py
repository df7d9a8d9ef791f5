"""What each inference engine documents, in one place: which of the
gateway's request fields it takes, how its streams report usage, where its
per-request timing is and what it means, and which Prometheus counters of
its own count the tokens it served (reconciliation's other side).

Every engine is spoken to through its OpenAI-compatible API. Timings come
back as the ledger's three durations (milliseconds):

- queue: arrival to scheduling;
- ttft: scheduling to the first token;
- generation: first token to last, or, with no ttft (an engine that reports
  its inference time whole), scheduling to last token.

An engine that reports none leaves the request's timeline to the gateway's
own window (sent to last byte), and the ledger row says `timing: gateway`.

Sources, per engine:

- vLLM: `--enable-per-request-metrics` adds `metrics` {queue_time_ms,
  time_to_first_token_ms (from scheduling), generation_time_ms} to a
  response and to a stream's final usage chunk (docs/features/
  per_request_metrics.md). /metrics: vllm:prompt_tokens_total,
  vllm:generation_tokens_total.
- TensorRT-LLM (trtllm-serve): with `return_perf_metrics: true` and
  `perf_metrics_max_requests` in its --config, GET /perf_metrics returns
  (and drains) finished requests' timing_metrics: arrival_time,
  first_scheduled_time, first_token_time, last_token_time, seconds on a
  steady clock, keyed by the engine's request id, which only a stream's
  chunk id carries (`chatcmpl-<id>`; tensorrt_llm/serve/openai_server.py,
  get_perf_metrics). /prometheus/metrics: trtllm_prompt_tokens_total,
  trtllm_generation_tokens_total.
- NIM for LLMs: NIM_PER_REQ_METRICS_ENABLE=1 adds `stats`
  {time_in_queue_in_ms, generation_time_in_ms (total processing),
  response_tokens: {time_to_first_token_in_ms (from processing start)}}
  (docs.nvidia.com/nim/large-language-models/1.14.0/
  nim-per-request-metrics.html); NIM 2 is vLLM underneath and may answer
  vLLM's `metrics` instead. /v1/metrics: prompt_tokens_total,
  generation_tokens_total.
- TGI: a non-streaming answer's headers x-queue-time and x-inference-time
  (whole milliseconds; router/src/server.rs, generate_internal); a stream
  sends its headers before generating, so carries none. /metrics:
  tgi_request_input_length and tgi_request_generated_tokens histograms
  (their _sum), the latter of successful requests only.
- SGLang: usage only in its OpenAI API (no timing). /metrics (with
  --enable-metrics): sglang:prompt_tokens_total,
  sglang:generation_tokens_total, one series per tensor-parallel rank.
- Triton's OpenAI frontend: usage only (from 25.08 with the vLLM backend,
  25.12 with TRT-LLM), `include_usage` but no continuous usage. /metrics:
  Triton core counts no tokens; its vLLM backend exports vllm:* (with
  REPORT_CUSTOM_METRICS), its TRT-LLM backend nv_llm_input_token_len and
  nv_llm_output_token_len histograms.
- NVIDIA Dynamo's frontend (its workers behind it): asked per request
  with `nvext: {extra_fields: ["worker_id", "timing"]}`, an answer
  carries `nvext.worker_id` {prefill_worker_id, decode_worker_id} and
  `nvext.timing` {request_received_ms (epoch), prefill_wait_time_ms,
  prefill_time_ms, ttft_ms, total_time_ms; durations from the frontend's
  receipt}; a stream has the timing on its finishing chunk, not on the
  usage-only chunk after it (checked against ai-dynamo 1.6.1). /metrics:
  dynamo_frontend_output_tokens_total and the dynamo_frontend_input_
  sequence_tokens histogram (its _sum), per served model.
- Any other OpenAI-compatible server: usage only; no counters known."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from serving.choices import Engine, ReplicaRole


@dataclass(frozen=True)
class WorkerSplit:
    """Which workers behind a frontend served a request (Dynamo's
    nvext.worker_id, ids as decimal text; one worker for both phases when
    aggregated), and how long its prefill ran on the prefill worker."""

    prefill: str
    decode: str
    prefill_ms: Decimal | None = None

    @property
    def split(self) -> bool:
        return self.prefill != self.decode


@dataclass(frozen=True)
class Timings:
    """One request's engine-measured durations, in milliseconds (None: the
    engine did not say), and the workers it ran on where a frontend says."""

    queue_ms: Decimal | None = None
    ttft_ms: Decimal | None = None
    generation_ms: Decimal | None = None
    workers: WorkerSplit | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.queue_ms, self.ttft_ms, self.generation_ms))


NO_TIMINGS = Timings()
# An answer as the gateway read it: its JSON (a whole answer, or a stream's
# last usage event) and its HTTP headers.
TimingReader = Callable[[Mapping[str, Any], Mapping[str, str]], Timings]


def _vllm_timings(data: Mapping[str, Any], headers: Mapping[str, str]) -> Timings:
    metrics = data.get("metrics")
    if not isinstance(metrics, dict):
        return NO_TIMINGS
    return Timings(
        _number(metrics.get("queue_time_ms")),
        _number(metrics.get("time_to_first_token_ms")),
        _number(metrics.get("generation_time_ms")),
    )


def _nim_timings(data: Mapping[str, Any], headers: Mapping[str, str]) -> Timings:
    """NIM's `stats`: time in queue; time from processing start to the first
    token; generation_time_in_ms, its total processing time (so the
    ledger's generation is that less the TTFT, or, without a TTFT, all of
    it from scheduling)."""
    stats = data.get("stats")
    if not isinstance(stats, dict):
        return _vllm_timings(data, headers)  # NIM 2: vLLM's own
    tokens = stats.get("response_tokens")
    ttft = _number(tokens.get("time_to_first_token_in_ms")) if isinstance(tokens, dict) else None
    total = _number(stats.get("generation_time_in_ms"))
    if total is not None and ttft is not None:
        total = max(total - ttft, Decimal(0))
    return Timings(_number(stats.get("time_in_queue_in_ms")), ttft, total)


def _number(value: Any) -> Decimal | None:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(str(value))
    except ArithmeticError:
        return None
    # A negative duration is no duration: the row keeps the gateway's window.
    return number if number.is_finite() and number >= 0 else None


def _dynamo_timings(data: Mapping[str, Any], headers: Mapping[str, str]) -> Timings:
    """Dynamo's nvext.timing: waiting for a prefill worker (the queue), the
    rest of its TTFT (scheduling to the first token), the first token to
    the last (total less TTFT)."""
    nvext = data.get("nvext")
    if not isinstance(nvext, dict):
        return NO_TIMINGS
    timing = nvext.get("timing") if isinstance(nvext.get("timing"), dict) else {}
    workers = _dynamo_workers(nvext.get("worker_id"), _number(timing.get("prefill_time_ms")))
    ttft, total = _number(timing.get("ttft_ms")), _number(timing.get("total_time_ms"))
    if ttft is None or total is None or total < ttft:
        return Timings(workers=workers)
    queue = _number(timing.get("prefill_wait_time_ms"))
    queue = queue if queue is not None and queue <= ttft else None
    return Timings(queue, ttft - (queue or 0), total - ttft, workers=workers)


def _dynamo_workers(ids: Any, prefill_ms: Decimal | None) -> WorkerSplit | None:
    """nvext.worker_id: {prefill_worker_id, decode_worker_id} (the prefill's
    missing when one worker ran both)."""
    if not isinstance(ids, dict):
        return None
    decode = dynamo_instance(ids.get("decode_worker_id"))
    if decode is None:
        return None
    prefill = dynamo_instance(ids.get("prefill_worker_id")) or decode
    return WorkerSplit(prefill=prefill, decode=decode, prefill_ms=prefill_ms)


def dynamo_instance(value: Any) -> str | None:
    """A Dynamo worker's instance id (an unsigned 64-bit integer, past what
    a database's bigint holds) as the decimal text it is kept as; None if
    `value` is none."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return str(value)


@dataclass(frozen=True)
class Listed:
    """A worker a Dynamo frontend's /health lists."""

    instance: str  # dynamo_instance's text: what its answers name it by
    component: str
    role: str  # serving.choices.ReplicaRole


def workers_listed(health: Mapping[str, Any]) -> list[Listed]:
    """The workers a Dynamo frontend's /health lists ("instances": component,
    endpoint, instance_id per endpoint of each worker): each instance with a
    `generate` endpoint. Component `prefill` is a disaggregated pair's
    prefill worker; any other (`backend`) a decode worker where a prefill
    worker is listed beside it, else an aggregated one. (Its /metrics says
    the same per worker, `worker_type`, but only of workers that served.)"""
    found: dict[str, str] = {}
    for item in health.get("instances") or []:
        if not isinstance(item, dict) or item.get("endpoint") != "generate":
            continue
        instance = dynamo_instance(item.get("instance_id"))
        if instance is not None:
            found[instance] = str(item.get("component") or "backend")
    split = "prefill" in found.values()
    return [
        Listed(
            instance=instance,
            component=component,
            role=ReplicaRole.PREFILL
            if component == "prefill"
            else (ReplicaRole.DECODE if split else ReplicaRole.BOTH),
        )
        for instance, component in sorted(found.items())
    ]


def _tgi_timings(data: Mapping[str, Any], headers: Mapping[str, str]) -> Timings:
    inference = headers.get("x-inference-time")
    if inference is None:
        return NO_TIMINGS  # a stream: its headers left before it ran
    return Timings(_number(headers.get("x-queue-time")), None, _number(inference))


def _no_timings(data: Mapping[str, Any], headers: Mapping[str, str]) -> Timings:
    return NO_TIMINGS


def perf_metrics_timings(entry: Mapping[str, Any]) -> Timings:
    """TensorRT-LLM's /perf_metrics entry as the ledger's durations (its
    times are seconds on one steady clock: only their differences mean
    anything)."""
    perf = entry.get("perf_metrics") if isinstance(entry, dict) else None
    times = perf.get("timing_metrics") if isinstance(perf, dict) else None
    if not isinstance(times, dict):
        return NO_TIMINGS
    try:
        arrival, scheduled, first, last = (
            Decimal(str(times[k]))
            for k in ("arrival_time", "first_scheduled_time", "first_token_time", "last_token_time")
        )
    except (KeyError, ArithmeticError, ValueError):
        return NO_TIMINGS
    if not arrival <= scheduled <= first <= last:
        return NO_TIMINGS
    thousand = Decimal(1000)
    return Timings(
        (scheduled - arrival) * thousand, (first - scheduled) * thousand, (last - first) * thousand
    )


@dataclass(frozen=True)
class Counters:
    """Where an engine's Prometheus metrics are and which families count
    what (a replica metric sample's fields). `histogram_sums`: families
    whose `_sum` is the count (TGI's token histograms)."""

    path: str
    families: Mapping[str, str]
    histogram_sums: Mapping[str, str] = field(default_factory=dict)
    # Read instead when none of `families`' token counters is there (NIM 2,
    # vLLM underneath, exports vLLM's names).
    fallback: Counters | None = None
    # Its series appear with a model's first request (Dynamo's frontend):
    # a page that answers without them has counted nothing yet, 0.
    zero_when_absent: bool = False


VLLM_FAMILIES = {
    "vllm:num_requests_running": "requests_running",
    "vllm:num_requests_waiting": "requests_waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:prompt_tokens": "prompt_tokens_total",
    "vllm:generation_tokens": "generation_tokens_total",
    "vllm:num_preemptions": "preemptions_total",
}


VLLM_COUNTERS = Counters("/metrics", VLLM_FAMILIES)


@dataclass(frozen=True)
class EngineSpec:
    engine: str
    # Takes vLLM's own request fields (priority, cache_salt): others may
    # refuse a field they do not know.
    vllm_fields: bool
    # Honours stream_options.continuous_usage_stats (usage on every chunk):
    # without it, a stream cut short is counted by its chunks.
    continuous_usage: bool
    timings: TimingReader
    # None: no token counters known; the scrape only asks whether it answers.
    counters: Counters | None
    # Answers 200 once it serves (replica_register waits for it).
    health_path: str = "/health"
    # TensorRT-LLM: timing from /perf_metrics, matched by a stream's id, so
    # every request goes upstream as a stream.
    perf_metrics_path: str | None = None
    # What reconciliation against its counters can and cannot tell.
    counters_note: str = ""
    # An extension the gateway asks of every request (Dynamo's nvext: its
    # worker ids and timing), as (top-level field, what to ask): merged
    # into what the client asked, and taken out of the answer again unless
    # the client asked for it too. On a stream the timings ride on the last
    # event that carries it.
    extension: tuple[str, Mapping[str, Any]] | None = None


ENGINES: dict[str, EngineSpec] = {
    Engine.VLLM: EngineSpec(
        engine=Engine.VLLM,
        vllm_fields=True,
        continuous_usage=True,
        timings=_vllm_timings,
        counters=VLLM_COUNTERS,
        counters_note="vllm:prompt_tokens_total and vllm:generation_tokens_total on /metrics",
    ),
    Engine.TRTLLM: EngineSpec(
        engine=Engine.TRTLLM,
        vllm_fields=False,
        continuous_usage=True,
        timings=_no_timings,
        counters=Counters(
            "/prometheus/metrics",
            {
                "trtllm_prompt_tokens": "prompt_tokens_total",
                "trtllm_generation_tokens": "generation_tokens_total",
            },
        ),
        perf_metrics_path="/perf_metrics",
        counters_note=(
            "trtllm_prompt_tokens_total and trtllm_generation_tokens_total on "
            "/prometheus/metrics (served with return_perf_metrics; older releases have no "
            "token counters)"
        ),
    ),
    Engine.NIM: EngineSpec(
        engine=Engine.NIM,
        vllm_fields=False,
        continuous_usage=False,
        timings=_nim_timings,
        counters=Counters(
            "/v1/metrics",
            {
                "prompt_tokens": "prompt_tokens_total",
                "generation_tokens": "generation_tokens_total",
                "num_requests_running": "requests_running",
                "num_requests_waiting": "requests_waiting",
            },
            fallback=Counters("/v1/metrics", VLLM_FAMILIES),
        ),
        health_path="/v1/health/ready",
        counters_note="prompt_tokens_total and generation_tokens_total on /v1/metrics",
    ),
    Engine.SGLANG: EngineSpec(
        engine=Engine.SGLANG,
        vllm_fields=False,
        continuous_usage=True,
        timings=_no_timings,
        counters=Counters(
            "/metrics",
            {
                "sglang:prompt_tokens": "prompt_tokens_total",
                "sglang:generation_tokens": "generation_tokens_total",
                "sglang:num_running_reqs": "requests_running",
                "sglang:num_queue_reqs": "requests_waiting",
            },
        ),
        counters_note=(
            "sglang:prompt_tokens_total and sglang:generation_tokens_total (served with "
            "--enable-metrics; the first tensor-parallel rank's)"
        ),
    ),
    Engine.TGI: EngineSpec(
        engine=Engine.TGI,
        vllm_fields=False,
        continuous_usage=False,
        timings=_tgi_timings,
        counters=Counters(
            "/metrics",
            {"tgi_queue_size": "requests_waiting", "tgi_batch_current_size": "requests_running"},
            histogram_sums={
                "tgi_request_input_length": "prompt_tokens_total",
                "tgi_request_generated_tokens": "generation_tokens_total",
            },
        ),
        counters_note=(
            "the sums of tgi_request_input_length and tgi_request_generated_tokens; the "
            "latter counts successful requests only, so an aborted stream's output shows as "
            "a negative gap"
        ),
    ),
    Engine.TRITON: EngineSpec(
        engine=Engine.TRITON,
        vllm_fields=False,
        continuous_usage=False,
        timings=_no_timings,
        counters=Counters(
            "/metrics",
            VLLM_FAMILIES,
            histogram_sums={
                "nv_llm_input_token_len": "prompt_tokens_total",
                "nv_llm_output_token_len": "generation_tokens_total",
            },
        ),
        health_path="/health/ready",
        counters_note=(
            "Triton's core counts no tokens: its vLLM backend exports vllm:* (with "
            "REPORT_CUSTOM_METRICS), its TensorRT-LLM backend nv_llm_input_token_len and "
            "nv_llm_output_token_len; without either, not reconciled"
        ),
    ),
    Engine.DYNAMO: EngineSpec(
        engine=Engine.DYNAMO,
        vllm_fields=False,
        continuous_usage=True,
        timings=_dynamo_timings,
        counters=Counters(
            "/metrics",
            {
                "dynamo_frontend_output_tokens": "generation_tokens_total",
                "dynamo_frontend_inflight_requests": "requests_running",
                "dynamo_frontend_queued_requests": "requests_waiting",
            },
            histogram_sums={"dynamo_frontend_input_sequence_tokens": "prompt_tokens_total"},
            zero_when_absent=True,
        ),
        counters_note=(
            "the frontend's dynamo_frontend_output_tokens_total and the sum of its "
            "dynamo_frontend_input_sequence_tokens, every worker behind it together"
        ),
        extension=("nvext", {"extra_fields": ["worker_id", "timing"]}),
    ),
    Engine.OPENAI: EngineSpec(
        engine=Engine.OPENAI,
        vllm_fields=False,
        continuous_usage=False,
        timings=_no_timings,
        counters=None,
        health_path="/v1/models",
        counters_note="no token counters known: not reconciled (scraped for liveness only)",
    ),
}


def engine_spec(engine: str) -> EngineSpec:
    return ENGINES[engine]
