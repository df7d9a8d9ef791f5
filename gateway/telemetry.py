"""The gateway's Prometheus metrics, served at its own /metrics: requests
and tokens per tenant, latency histograms, and the record buffer's health.

Labels are bounded: tenant slug, model name, status and token kind; never
request ids or keys. The fair queue's metrics carry no tenant: its depth and
wait by priority class, and the slots in use per replica (by name, one per
registered replica). Each gateway process exposes its own counters and
gauges (scrape them all; Prometheus sums across instances)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.stalls import LAG_BOUNDS_MS
from serving.records import CompletedRequest
from tenants.choices import VLLM_PRIORITY

REGISTRY = CollectorRegistry(auto_describe=True)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 600)

REQUESTS = Counter(
    "gateway_requests",
    "Completed requests by tenant, model and outcome.",
    ["tenant", "model", "status"],
    registry=REGISTRY,
)
TOKENS = Counter(
    "gateway_tokens",
    "Tokens metered by tenant, model and kind (prompt, cached, completion).",
    ["tenant", "model", "kind"],
    registry=REGISTRY,
)
REQUEST_SECONDS = Histogram(
    "gateway_request_seconds",
    "End-to-end time of served requests, from receipt to the last byte.",
    ["model"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
TTFT_SECONDS = Histogram(
    "gateway_time_to_first_token_seconds",
    "Time from receipt to the first token.",
    ["model"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
FLUSH_SECONDS = Histogram(
    "gateway_record_flush_seconds",
    "Time to write one flush of completed-request records to the sink.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5),
    registry=REGISTRY,
)
FLUSHED = Counter("gateway_records_flushed", "Records written to the sink.", registry=REGISTRY)
DEAD_LETTERED = Counter(
    "gateway_records_dead_lettered",
    "Records the sink refused, kept in the dead-letter file.",
    registry=REGISTRY,
)
BACKLOG = Gauge(
    "gateway_record_backlog", "Records waiting in memory for the sink.", registry=REGISTRY
)
LOOP_LAG_SECONDS = Histogram(
    "gateway_event_loop_lag_seconds",
    "How late the event loop woke up, sampled every 20 ms: what every request in "
    "flight waited behind other work in the gateway process.",
    buckets=tuple(bound / 1000 for bound in LAG_BOUNDS_MS),  # as /healthz counts them
    registry=REGISTRY,
)
QUEUE_DEPTH = Gauge(
    "gateway_queue_depth",
    "Requests waiting in the gateway's fair queue, by priority class.",
    ["priority_class"],
    registry=REGISTRY,
)
QUEUE_SECONDS = Histogram(
    "gateway_queue_seconds",
    "Time a request waited at the gateway (for its tenant's budget and a replica slot), "
    "by priority class.",
    ["priority_class"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
OUTSTANDING = Gauge(
    "gateway_replica_outstanding",
    "Requests this gateway has outstanding at each replica (fair queuing on).",
    ["replica"],
    registry=REGISTRY,
)
CLASS_BY_PRIORITY = {number: str(name) for name, number in VLLM_PRIORITY.items()}


_CHILDREN: dict[tuple, object] = {}


def labeled(metric, *labels: str):
    """`metric.labels(*labels)`, kept: prometheus_client checks and locks on
    every `labels` call, and a request touches six of them (the hot path)."""
    key = (id(metric), *labels)
    child = _CHILDREN.get(key)
    if child is None:
        child = _CHILDREN[key] = metric.labels(*labels)
    return child


def priority_label(priority: int) -> str:
    """The class name of a vLLM priority (bounded: unknown numbers are 'other')."""
    return CLASS_BY_PRIORITY.get(priority, "other")


def queue_wait_observe(priority: int, seconds: float) -> None:  # ok-float
    labeled(QUEUE_SECONDS, priority_label(priority)).observe(seconds)


def depth_by_class(depth_by_priority: dict[int, int]) -> dict[str, int]:
    """Requests waiting per priority class name (classes nobody waits in: 0)."""
    depth = dict.fromkeys(CLASS_BY_PRIORITY.values(), 0)
    for priority, waiting in depth_by_priority.items():
        label = priority_label(priority)
        depth[label] = depth.get(label, 0) + waiting
    return depth


def queue_gauges_set(
    waiting_by_class: dict[str, int], outstanding_by_replica: dict[str, int]
) -> None:
    """The fair queue's state at scrape time."""
    for label, waiting in waiting_by_class.items():
        QUEUE_DEPTH.labels(label).set(waiting)
    OUTSTANDING.clear()
    for replica, busy in outstanding_by_replica.items():
        OUTSTANDING.labels(replica).set(busy)


def request_observe(
    record: CompletedRequest, *, tenant: str, model_label: str | None = None
) -> None:
    """Count a finished request; `model_label` replaces the record's model
    where that is not a bounded label (a name the client made up)."""
    model = model_label or record.model or "unknown"
    labeled(REQUESTS, tenant, model, record.status).inc()
    if record.prompt_tokens or record.completion_tokens:
        labeled(TOKENS, tenant, model, "prompt").inc(record.prompt_tokens)
        labeled(TOKENS, tenant, model, "cached").inc(record.cached_tokens)
        labeled(TOKENS, tenant, model, "completion").inc(record.completion_tokens)
    if record.sent_at is not None:  # it reached a replica
        labeled(REQUEST_SECONDS, model).observe(
            (record.ended_at - record.received_at).total_seconds()
        )
        if record.first_token_at is not None:
            labeled(TTFT_SECONDS, model).observe(
                (record.first_token_at - record.received_at).total_seconds()
            )


def exposition() -> bytes:
    return generate_latest(REGISTRY)
