"""The gateway's Prometheus metrics, served at /metrics on its operator port
(gateway.operator), never on the port tenants call: requests and tokens per
tenant, latency histograms, and the record buffer's health.

Labels are bounded: tenant slug, model name, status and token kind; never
request ids or keys. The fair queue's metrics carry no tenant: its depth and
wait by priority class, and the slots in use per replica (by name, one per
registered replica). One scrape covers every worker of a `manage.py
gateway` (several: prometheus_client's multiprocess mode, gateway.operator
says why); each gateway (a host, a pod) is a scrape target of its own.
In multiprocess mode a gauge says how its workers' values add up: each one
here is a worker's share of a total, so "livesum" (over the workers alive)."""

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
    "gateway_record_backlog",
    "Records the ledger does not hold yet (in the spool, or in memory).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
SPOOL_BYTES = Gauge(
    "gateway_spool_bytes",
    "Bytes of record segments in the gateway's spool (gateway.spool).",
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
SPOOL_OLDEST_SECONDS = Gauge(
    "gateway_spool_oldest_unwritten_seconds",
    "Age of the oldest record the ledger does not hold yet.",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
SPOOL_FULL = Gauge(
    "gateway_spool_full",
    "1 while a worker's spool is full (its cap, or its disk): see GATEWAY_SPOOL_FULL.",
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
SPOOL_REPLAYED = Counter(
    "gateway_spool_replayed_records",
    "Records a worker found in its spool on starting (left by a process before it), "
    "written to the ledger since.",
    registry=REGISTRY,
)
SPOOL_TORN = Counter(
    "gateway_spool_torn_records",
    "Torn or corrupt segment tails found on starting (kept apart in the spool's torn/).",
    registry=REGISTRY,
)
SPOOL_FULL_REQUESTS = Counter(
    "gateway_spool_full_requests",
    "Requests that came while the spool was full: refused (503 metering_unavailable), "
    "or served anyway with their record held in memory (GATEWAY_SPOOL_FULL=serve).",
    ["outcome"],
    registry=REGISTRY,
)
DROPPED = Counter(
    "gateway_records_dropped",
    "Records lost: held in memory (no spool, or a full one) past the memory cap.",
    registry=REGISTRY,
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
    multiprocess_mode="livesum",
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
    multiprocess_mode="livesum",
)
REPLICA_UP = Gauge(
    "gateway_replica_up",
    "1 while the gateway routes to the replica, 0 while its health checks find it down "
    "(gateway.health_checks), for each replica registered and not draining.",
    ["replica"],
    registry=REGISTRY,
    # Each worker checks on its own: the gateway counts a replica up only
    # while every worker alive routes to it.
    multiprocess_mode="livemin",
)
REPLICA_TRANSITIONS = Counter(
    "gateway_replica_health_transitions",
    "Times the gateway's health checks found a replica gone down or back up (`to`), "
    "counted by each worker that found it.",
    ["replica", "to"],
    registry=REGISTRY,
)
CONCURRENCY = Gauge(
    "gateway_replica_concurrency_limit",
    "How many requests the gateway lets each adaptive replica run at once (its N, found "
    "from its step time: gateway.adaptive), by the worker that found the fewest.",
    ["replica"],
    registry=REGISTRY,
    multiprocess_mode="livemin",
)
CLASS_BY_PRIORITY = {number: str(name) for name, number in VLLM_PRIORITY.items()}


_CHILDREN: dict[tuple, object] = {}
_OUTSTANDING_LABELS: set[str] = set()  # the replicas OUTSTANDING has a series for
_REPLICA_UP_LABELS: set[str] = set()  # ... and REPLICA_UP
_CONCURRENCY_LABELS: set[str] = set()  # ... and CONCURRENCY


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
    """The fair queue's state at scrape time. A replica no longer listed
    is set to 0 before its series is dropped: in multiprocess mode its last
    value lives on in the worker's file, which dropping the series leaves."""
    for label, waiting in waiting_by_class.items():
        QUEUE_DEPTH.labels(label).set(waiting)
    _replica_series_set(OUTSTANDING, _OUTSTANDING_LABELS, outstanding_by_replica)


def replicas_up_set(up_by_replica: dict[str, bool]) -> None:
    """Each replica checked, up or down; one no longer checked (gone,
    draining) loses its series, set to 0 first for the reason
    queue_gauges_set gives."""
    _replica_series_set(
        REPLICA_UP, _REPLICA_UP_LABELS, {r: 1 if up else 0 for r, up in up_by_replica.items()}
    )


def concurrency_set(limit_by_replica: dict[str, int]) -> None:
    """Each adaptive replica's N (gateway.adaptive), at scrape time."""
    _replica_series_set(CONCURRENCY, _CONCURRENCY_LABELS, limit_by_replica)


def _replica_series_set(gauge: Gauge, labels: set[str], values: dict[str, int]) -> None:
    """`gauge`'s series by replica made exactly `values`; one no longer
    listed is set to 0 before it is dropped, for the reason queue_gauges_set
    gives."""
    for replica in labels - values.keys():
        gauge.labels(replica).set(0)
        gauge.remove(replica)
    labels.clear()
    for replica, value in values.items():
        gauge.labels(replica).set(value)
        labels.add(replica)


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
