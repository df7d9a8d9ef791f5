"""NVIDIA Dynamo's disaggregated serving for real: one frontend, a mocker
prefill worker and two mocker decode workers (vLLM-style), the frontend a
replica of the platform and each worker a replica of its own registered
from the frontend's /health (serving.engine_workers) with a GPU each.

Each request gets a prefill row on the worker that ran its prefill and a
decode row on the worker that decoded it (the ones Dynamo's nvext names),
is billed once (its prompt by the prefill row, its output by the decode
row), balances against the frontend's own token counters, and the hour's
GPU-seconds are attributed per worker with every window conserved."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from pathlib import Path

import pytest
from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from metering.choices import Phase
from metering.jobs import metering_run
from metering.models import AttributionWindow, UsageRollup
from metering.reconciliation import reconciliation_compute
from metering.windows import attribution_conservation_check
from serving.choices import ReplicaRole, ReplicaStatus
from serving.dynamo import WorkerGroup, dynamo_start
from serving.engine_workers import GONE, engine_workers_sync
from serving.engines import workers_listed
from serving.gpu_shares import Share
from serving.scraper import replica_scrape
from serving.services import local_gpu_ensure, replica_gpu_shares_set
from serving.tiny_model import MODEL_NAME, tiny_model_write
from tests.gateway.test_disagg import _rows
from tests.gateway.test_dynamo import _events, _post

HOUR_NS = 3600 * 10**9


@pytest.fixture(scope="module")
def dynamo_split(dynamo_runtime):
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    deployment = dynamo_start(
        name="test-disagg",
        model_dir=model_dir,
        served_model=MODEL_NAME,
        workers=[WorkerGroup(mode="prefill", count=1), WorkerGroup(mode="decode", count=2)],
    )
    try:
        deployment.wait_ready(timeout=120)
        yield deployment
    finally:
        deployment.stop()


def _registered(fleet, deployment):
    """The frontend as a replica with no GPU of its own, its workers found
    by a scrape, a GPU each."""
    front = fleet.add_replica("dyn", deployment.base_url, "shared", engine="dynamo")
    replica_gpu_shares_set(replica=front, shares=[])
    replica_scrape(replica=front)
    workers = {w.engine_instance: w for w in front.workers.all()}
    for worker in workers.values():
        gpu = local_gpu_ensure(serial=f"gpu-{worker.engine_instance}")
        replica_gpu_shares_set(replica=worker, shares=[Share(gpu_id=gpu.pk)])
    return front, workers


def test_each_phase_is_a_row_on_its_worker_billed_once_and_conserved(fleet, dynamo_split):
    fleet.add_tenant("a")
    fleet.add_tenant("b")
    registered_at = timezone.now() - timedelta(seconds=1)
    front, workers = _registered(fleet, dynamo_split)
    found = dynamo_split.workers_found()
    assert set(workers) == {str(i) for ids in found.values() for i in ids}
    assert sorted(w.role for w in workers.values()) == ["decode", "decode", "prefill"]
    assert all(w.pool_id == front.pool_id and w.front_id == front.pk for w in workers.values())
    fleet.ready()  # one replica routed to: the frontend

    ask = {"nvext": {"extra_fields": ["worker_id"]}}  # the client's own, to check the rows by
    answers = [_post(fleet, "a", {"max_tokens": 6, **ask}) for _ in range(3)]
    stream = {"stream": True, "stream_options": {"include_usage": True}}
    answers += [_post(fleet, "b", {"max_tokens": 5, **stream, **ask}) for _ in range(3)]
    said = [a.json()["nvext"]["worker_id"] for a in answers[:3]]
    said += [_events(a)[-2]["nvext"]["worker_id"] for a in answers[3:]]
    usages = [a.json()["usage"] for a in answers[:3]] + [
        _events(a)[-1]["usage"] for a in answers[3:]
    ]

    for answer, ids, usage in zip(answers, said, usages, strict=True):
        rows = _rows(answer.headers["x-request-id"])
        assert set(rows) == {Phase.PREFILL, Phase.DECODE}
        prefill, decode = rows[Phase.PREFILL], rows[Phase.DECODE]
        assert prefill.replica_id == workers[str(ids["prefill_worker_id"])].pk
        assert decode.replica_id == workers[str(ids["decode_worker_id"])].pk
        assert (prefill.prompt_tokens, prefill.completion_tokens) == (usage["prompt_tokens"], 0)
        assert decode.completion_tokens == usage["completion_tokens"]
        assert prefill.timing == decode.timing == "engine"
        # The prefill ends where the decode's own part begins.
        assert prefill.queue_ms + prefill.ttft_ms == decode.queue_ms
        assert prefill.ended_at <= decode.ended_at

    # Reconciliation: the frontend's own counters (every worker behind it)
    # against the workers' rows, each request once.
    replica_scrape(replica=front)
    gap = reconciliation_compute(
        replica=front, start=registered_at, end=timezone.now() + timedelta(seconds=1)
    )
    prompt = sum(u["prompt_tokens"] for u in usages)
    output = sum(u["completion_tokens"] for u in usages)
    assert (gap.vllm_prompt_tokens, gap.vllm_generation_tokens) == (prompt, output)
    assert (gap.metered_prompt_tokens, gap.metered_generation_tokens) == (prompt, output)

    # The hour attributed: a window per worker that served, each conserved;
    # each tenant billed its prompt and its output once.
    hour = timezone.now().replace(minute=0, second=0, microsecond=0)
    run = metering_run(now=hour + timedelta(hours=1, minutes=5))
    assert run.windows >= 2
    windows = {w.replica_id: w for w in AttributionWindow.objects.filter(start=hour)}
    assert set(windows) <= {w.pk for w in workers.values()}
    prefill_worker = next(w for w in workers.values() if w.role == ReplicaRole.PREFILL)
    assert windows[prefill_worker.pk].attributed_ns > 0
    for window in windows.values():
        assert window.capacity_ns == HOUR_NS  # one GPU, the hour
        assert window.attributed_ns + window.idle_ns == HOUR_NS
    assert attribution_conservation_check(since=hour - timedelta(hours=1)) == []
    billed = {
        tenant: UsageRollup.objects.filter(hour=hour, tenant=fleet.tenants[tenant]).aggregate(
            prompt=Sum("prompt_tokens"), output=Sum("completion_tokens"), ok=Sum("requests_ok")
        )
        for tenant in ("a", "b")
    }
    assert billed["a"] == {
        "prompt": sum(u["prompt_tokens"] for u in usages[:3]),
        "output": 18,
        "ok": 3,
    }
    assert billed["b"] == {
        "prompt": sum(u["prompt_tokens"] for u in usages[3:]),
        "output": 15,
        "ok": 3,
    }
    seconds = UsageRollup.objects.filter(hour=hour, replica=prefill_worker).aggregate(
        s=Sum("device_seconds")
    )["s"]
    assert seconds > Decimal(0)  # the prefill worker's GPU-seconds, billed to who used it


def test_a_worker_the_frontend_stops_listing_goes_down_and_comes_back(fleet, dynamo_split):
    front, _ = _registered(fleet, dynamo_split)
    listed = workers_listed(dynamo_split._get_json("/health"))
    gone = next(item for item in listed if item.role == ReplicaRole.DECODE)
    engine_workers_sync(frontend=front, listed=[i for i in listed if i is not gone])
    worker = front.workers.get(engine_instance=gone.instance)
    assert (worker.status, worker.last_error) == (ReplicaStatus.DOWN, GONE)
    replica_scrape(replica=front)  # listed again
    worker.refresh_from_db()
    assert worker.status == ReplicaStatus.UP
    assert front.workers.count() == 3  # no second row for the same worker
