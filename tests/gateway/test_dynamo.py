"""NVIDIA Dynamo as an engine, for real: its Rust frontend and its mocker
workers (serving.dynamo: vLLM-, SGLang- and TensorRT-LLM-style simulated
engines, two workers behind one frontend), registered as one replica whose
engine is `dynamo`, through the real gateway and the official openai client.

The gateway asks Dynamo for each request's timing (nvext) and keeps it out
of the client's answer unless the client asked for it; the ledger's
timeline is Dynamo's own (`timing: engine`), equal to what nvext said;
reconciliation balances against the frontend's own token counters; spend
control refuses in front of it; and every socket the deployment listens on
is on loopback."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import orjson
import pytest
from django.conf import settings
from django.utils import timezone

from billing.models import ModelPrice, PriceBook
from metering.reconciliation import reconciliation_compute
from serving.choices import ReplicaStatus
from serving.dynamo import ENGINE_TYPES, WorkerGroup, dynamo_start, listening_sockets
from serving.models import Replica, ServedModel
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME, tiny_model_write
from tests.fleet import wait_for_records
from tests.gateway.test_gateway_fair_queue import queue_depth, wait_until

HELLO = [{"role": "user", "content": "hello there"}]
MS = Decimal("0.001")


@pytest.fixture(scope="module", params=ENGINE_TYPES)
def dynamo(request, dynamo_runtime):
    """One frontend and two mocker workers of one engine type."""
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    deployment = dynamo_start(
        name=f"test-{request.param}",
        model_dir=model_dir,
        served_model=MODEL_NAME,
        workers=[WorkerGroup(engine_type=request.param, count=2)],
    )
    try:
        deployment.wait_ready(timeout=120)
        yield deployment
    finally:
        deployment.stop()


def _post(fleet, tenant: str, body: dict) -> httpx.Response:
    return httpx.post(
        f"{fleet.gateway}/v1/chat/completions",
        json={"model": MODEL_NAME, "messages": HELLO, **body},
        headers={"Authorization": f"Bearer {fleet.secrets[tenant]}"},
        timeout=30,
    )


def _events(answer: httpx.Response) -> list[dict]:
    return [
        orjson.loads(line[len("data: ") :])
        for line in answer.text.splitlines()
        if line.startswith("data: {")
    ]


def test_dynamo_is_metered_through_its_frontend_on_its_own_clock(fleet, dynamo):
    fleet.add_tenant("a")
    replica = fleet.add_replica("dyn", dynamo.base_url, "shared", engine="dynamo")
    fleet.ready()
    before = replica_scrape(replica=replica)
    client = fleet.client("a")
    plain = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=6
    )
    assert plain.parse().usage.completion_tokens == 6
    assert b"nvext" not in plain.http_response.content  # the gateway's ask, not the client's
    streamed = _post(
        fleet, "a", {"max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
    )
    events = _events(streamed)
    assert events[-1]["usage"]["completion_tokens"] == 5
    assert "nvext" not in streamed.text
    assert all("usage" not in e or e["choices"] == [] for e in events)  # as the client asked

    ids = [plain.headers["x-request-id"], streamed.headers["x-request-id"]]
    records = wait_for_records(ids)
    for rid, output in zip(ids, (6, 5), strict=True):
        row = records[rid]
        assert (row.status, row.completion_tokens, row.timing) == ("ok", output, "engine")
        assert row.prompt_tokens > 0 and row.ttft_ms > 0 and row.generation_ms > 0
        window = (row.ended_at - row.sent_at) / timedelta(milliseconds=1)
        assert row.queue_ms + row.ttft_ms + row.generation_ms <= Decimal(window) + 5

    # Reconciliation: the frontend's own counters (every worker behind it).
    after = replica_scrape(replica=replica)
    prompt = sum(records[i].prompt_tokens for i in ids)
    assert after.prompt_tokens_total - before.prompt_tokens_total == prompt
    assert after.generation_tokens_total - before.generation_tokens_total == 11
    gap = reconciliation_compute(
        replica=replica, start=before.scraped_at, end=timezone.now() + timedelta(seconds=1)
    )
    assert (gap.vllm_prompt_tokens, gap.vllm_generation_tokens) == (prompt, 11)
    assert (gap.metered_prompt_tokens, gap.metered_generation_tokens) == (prompt, 11)


def test_a_client_that_asks_for_nvext_gets_it_and_the_ledger_holds_its_timing(fleet, dynamo):
    """The client's own nvext ask is kept and joined with the gateway's
    (worker ids and timing both come back), plain and streamed; the row's
    queue, TTFT and generation are nvext's prefill wait, TTFT less that
    wait, and total less TTFT."""
    fleet.add_tenant("a")
    fleet.add_replica("dyn", dynamo.base_url, "shared", engine="dynamo")
    fleet.ready()
    ask = {"nvext": {"extra_fields": ["timing"]}}
    plain = _post(fleet, "a", {"max_tokens": 4, **ask})
    streamed = _post(fleet, "a", {"max_tokens": 4, "stream": True, **ask})
    timed = [e["nvext"] for e in _events(streamed) if "timing" in e.get("nvext", {})]
    said = [plain.json()["nvext"], timed[-1]]
    workers = {str(w) for ids in dynamo.workers_found().values() for w in ids}
    ids = [plain.headers["x-request-id"], streamed.headers["x-request-id"]]
    records = wait_for_records(ids)
    for rid, nvext in zip(ids, said, strict=True):
        assert str(nvext["worker_id"]["decode_worker_id"]) in workers
        timing = {k: Decimal(str(v)) for k, v in nvext["timing"].items()}
        wait, ttft = timing["prefill_wait_time_ms"], timing["ttft_ms"]
        row = records[rid]
        assert row.timing == "engine"
        assert row.queue_ms == wait.quantize(MS)
        assert row.ttft_ms == (ttft - wait).quantize(MS)
        assert row.generation_ms == (timing["total_time_ms"] - ttft).quantize(MS)


def test_spend_control_refuses_in_front_of_dynamo(fleet, dynamo):
    """A hard budget whose worst case no longer fits: 402 at the gateway,
    and the frontend never sees the request (its own request counter)."""
    fleet.add_tenant("capped", monthly_budget=Decimal("0.5"), budget_hard_percent=100)
    fleet.add_replica("dyn", dynamo.base_url, "shared", engine="dynamo")
    book = PriceBook.objects.create(name="list", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    ModelPrice.objects.create(
        book=book,
        served_model=ServedModel.objects.get(name=MODEL_NAME),
        input_per_mtok=Decimal(1000),
        cached_input_per_mtok=Decimal(1000),
        output_per_mtok=Decimal(2000),
    )
    fleet.ready()
    first = _post(fleet, "capped", {"max_tokens": 5})
    assert first.status_code == 200
    seen = _frontend_requests(dynamo.base_url)
    refused = _post(fleet, "capped", {"max_tokens": 300})  # 300 x 0.002 > 0.5 left
    assert refused.status_code == 402
    assert refused.json()["error"]["code"] == "budget_exceeded"
    assert _frontend_requests(dynamo.base_url) == seen


def test_fair_queuing_in_front_of_dynamo_sends_a_light_tenant_ahead_of_a_backlog(fleet, dynamo):
    """One slot at the gateway; the heavy tenant's six requests come first.
    First come, first served would send the light tenant's request after all
    six; the fair queue sends it next after the heavy tenant's turn."""
    fleet.add_tenant("heavy")
    fleet.add_tenant("light")
    fleet.add_replica("dyn", dynamo.base_url, "shared", engine="dynamo", max_inflight=1)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=7) as pool:
        heavy = [pool.submit(_post, fleet, "heavy", {"max_tokens": 60}) for _ in range(6)]
        wait_until(lambda: queue_depth(fleet.gateway) >= 4, what="the heavy backlog")
        light = pool.submit(_post, fleet, "light", {"max_tokens": 5})
        answers = [f.result() for f in [*heavy, light]]
    assert [a.status_code for a in answers] == [200] * 7
    ids = [a.headers["x-request-id"] for a in answers]
    records = wait_for_records(ids)
    light_sent = records[ids[-1]].sent_at
    after = [rid for rid in ids[:-1] if records[rid].sent_at > light_sent]
    assert len(after) >= 3, [records[rid].sent_at for rid in ids]  # FIFO: none after it


def test_every_socket_the_deployment_listens_on_is_loopback(dynamo):
    sockets = listening_sockets(dynamo.pids)
    assert len(sockets) >= 4  # frontend HTTP and response stream, broker x2, workers' RPC
    assert {address for address, _ in sockets} == {"127.0.0.1"}


def _frontend_requests(base_url: str) -> float:
    """The frontend's own count of requests it answered."""
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("dynamo_frontend_requests_total{")
    )


def test_a_stream_dynamo_cuts_is_billed_to_its_last_token_and_its_frontend_goes_down(
    fleet, dynamo_runtime
):
    """The frontend killed mid-stream: the client's stream ends with an
    error event after the tokens it got, the row is billed the output the
    last usage chunk counted (what the client saw), and the gateway's
    health checks mark the frontend down like any replica."""
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    deployment = dynamo_start(
        name="test-cut", model_dir=model_dir, served_model=MODEL_NAME, workers=[WorkerGroup()]
    )
    try:
        deployment.wait_ready(timeout=120)
        fleet.add_tenant("a")
        replica = fleet.add_replica("dyn", deployment.base_url, "shared", engine="dynamo")
        fleet.ready()
        frontend = next(p for p in deployment.processes if p.name.endswith("-frontend"))
        body = {
            "model": MODEL_NAME,
            "messages": HELLO,
            "max_tokens": 1500,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        seen, tail = 0, []
        with httpx.stream(
            "POST",
            f"{fleet.gateway}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {fleet.secrets['a']}"},
            timeout=30,
        ) as answer:
            rid = answer.headers["x-request-id"]
            for line in answer.iter_lines():
                if not line.startswith("data: {"):
                    continue
                event = orjson.loads(line[len("data: ") :])
                tail.append(event)
                if event.get("usage"):
                    seen = event["usage"]["completion_tokens"]
                if seen >= 40 and frontend.popen.poll() is None:
                    frontend.popen.kill()  # SIGKILL: no goodbye from the frontend
        assert 40 <= seen < 1500, tail[-3:]
        assert "error" in tail[-1]  # the client is told its stream was cut
        row = wait_for_records([rid])[rid]
        assert row.status in ("aborted", "error") and row.completion_tokens == seen
        wait_until(
            lambda: Replica.objects.get(pk=replica.pk).status == ReplicaStatus.DOWN,
            timeout=30,
            what="the frontend marked down",
        )
    finally:
        deployment.stop()
