"""Reading a replica's Prometheus metrics (where its engine exports them:
serving.engines) into a ReplicaMetricSample, and marking a replica that does
not answer as down (routing then avoids it until a later scrape finds it
answering again)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from decimal import Decimal

import httpx
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from serving.choices import Engine, ReplicaStatus
from serving.engine_workers import engine_workers_refresh
from serving.engines import VLLM_COUNTERS, Counters, engine_spec
from serving.models import Replica, ReplicaMetricSample
from serving.services import replica_set_status

INTEGER_FIELDS = {
    "requests_running",
    "requests_waiting",
    "prompt_tokens_total",
    "generation_tokens_total",
    "preemptions_total",
}


@dataclass
class Scrape:
    up: bool
    values: dict
    error: str = ""


def metrics_parse(text: str, counters: Counters = VLLM_COUNTERS) -> dict:
    """Sample fields from Prometheus exposition text, read as `counters`
    names them (serving.engines; counters lose their `_total` suffix in the
    parser). Series are summed over engines and labels, but only the first
    tensor-parallel rank of an engine that repeats them per rank (SGLang)."""
    totals: dict[str, float] = {}  # ok-float: Prometheus values are floats on the wire
    for family in text_string_to_metric_families(text):
        field = counters.families.get(family.name)
        wanted = family.name + "_sum"
        if field is None:
            field = counters.histogram_sums.get(family.name)
        elif family.type != "histogram":
            wanted = None
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created") or sample.labels.get("tp_rank", "0") != "0":
                continue
            if wanted is not None and sample.name != wanted:
                continue
            totals[field] = totals.get(field, 0.0) + sample.value
    if counters.fallback is not None and "prompt_tokens_total" not in totals:
        return metrics_parse(text, counters.fallback)
    if counters.zero_when_absent:
        totals = {
            f: 0.0 for f in (*counters.families.values(), *counters.histogram_sums.values())
        } | totals
    values: dict = {}
    for field, total in totals.items():
        if field in INTEGER_FIELDS:
            values[field] = round(total)
        else:
            values[field] = Decimal(repr(total)).quantize(Decimal("0.000001"))
    return values


def replica_scrape_fetch(
    base_url: str, *, engine: str = Engine.VLLM, timeout: float = 3.0
) -> Scrape:
    """The engine's counters, or, for one that exports none we know, only
    whether it answers."""
    spec = engine_spec(engine)
    path = spec.counters.path if spec.counters is not None else spec.health_path
    try:
        response = httpx.get(f"{base_url.rstrip('/')}{path}", timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        return Scrape(up=False, values={}, error=f"{type(exc).__name__}: {exc}"[:300])
    if spec.counters is None:
        return Scrape(up=True, values={})
    return Scrape(up=True, values=metrics_parse(response.text, spec.counters))


def replica_scrape(*, replica: Replica) -> ReplicaMetricSample:
    """Scrape one replica, store the sample, and update its status: a replica
    that does not answer goes down; one that answers again comes back up.
    Draining replicas keep their status (an operator set it)."""
    result = replica_scrape_fetch(replica.base_url, engine=replica.engine)
    if result.up:
        engine_workers_refresh(replica)  # a Dynamo frontend's: each a replica of its own
    sample = ReplicaMetricSample.objects.create(
        replica=replica,
        scraped_at=timezone.now(),
        up=result.up,
        error=result.error,
        **result.values,
    )
    if replica.status != ReplicaStatus.DRAINING:
        if result.up:
            replica_set_status(replica=replica, status=ReplicaStatus.UP)
        elif replica.status == ReplicaStatus.UP:
            replica_set_status(replica=replica, status=ReplicaStatus.DOWN, error=result.error)
    return sample


def replicas_scrape_all() -> int:
    """Every registered replica, a few at a time (a worker behind a frontend
    through its frontend: its counters are the frontend's)."""
    replicas = list(Replica.objects.filter(front__isnull=True))

    def one(replica: Replica) -> None:
        from django.db import close_old_connections

        try:
            replica_scrape(replica=replica)
        finally:
            close_old_connections()

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, replicas))
    return len(replicas)
