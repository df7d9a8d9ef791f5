"""Engines beside vLLM, through the real gateway: each replica is spoken to
in its engine's dialect (no vLLM-only field reaches another engine), its
usage and per-request timing are read where that engine puts them, and a
ledger row says whose clock its timeline is. Scraping and reconciliation
read each engine's own token counters, where it has any. The fake engines
answer as each engine documents (tests/gateway/fake_engines.py)."""

from __future__ import annotations

import os
import signal
from datetime import timedelta
from decimal import Decimal

import openai
import pytest
from django.utils import timezone

from metering.models import UsageEvent
from metering.reconciliation import reconciliation_compute
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    gateway_worker,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records,
)
from tests.gateway.fake_engines import OUTPUT_TOKENS, PROMPT_TOKENS, FakeEngine

HELLO = [{"role": "user", "content": "hello"}]
MS = Decimal("0.001")

# (queue_ms, ttft_ms, generation_ms) the ledger must hold, plain and streamed:
# None where the engine says nothing of a request's timing.
ENGINE_TIMED = (Decimal("4.000"), Decimal("6.000"), Decimal("20.000"))
UNTIMED = (None, None, None)
EXPECTED = {
    "trtllm": (ENGINE_TIMED, ENGINE_TIMED),  # from /perf_metrics, by the stream's id
    "nim": (ENGINE_TIMED, ENGINE_TIMED),  # its stats, on the answer or the last chunk
    "tgi": ((Decimal("4.000"), None, Decimal("26.000")), UNTIMED),  # headers: plain only
    "sglang": (UNTIMED, UNTIMED),
    "triton": (UNTIMED, UNTIMED),
    "openai": (UNTIMED, UNTIMED),
}


@pytest.fixture
def engines():
    started: dict[str, FakeEngine] = {}

    def start(engine: str) -> FakeEngine:
        started[engine] = FakeEngine(engine).start()
        return started[engine]

    yield start
    for fake in started.values():
        fake.stop()


def _timeline(record) -> tuple:
    return (record.queue_ms, record.ttft_ms, record.generation_ms)


def _request_ids(fleet, tenant: str) -> list[str]:
    """A plain request and a streamed one (with usage, as most clients ask)."""
    client = fleet.client(tenant)
    plain = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=3
    )
    assert plain.parse().usage.completion_tokens == OUTPUT_TOKENS
    streamed = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=HELLO,
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(streamed.parse())
    assert chunks[-1].usage.completion_tokens == OUTPUT_TOKENS
    return [plain.headers["x-request-id"], streamed.headers["x-request-id"]]


@pytest.mark.parametrize("engine", sorted(EXPECTED))
def test_each_engine_is_metered_from_what_it_documents(fleet, engines, engine):
    fake = engines(engine)
    fleet.add_tenant("a")
    fleet.add_replica("r", fake.base_url, "shared", engine=engine)
    fleet.ready()
    ids = _request_ids(fleet, "a")
    records = wait_for_records(ids)
    plain, streamed = records[ids[0]], records[ids[1]]
    for record in (plain, streamed):
        assert (record.status, record.prompt_tokens, record.completion_tokens) == (
            "ok",
            PROMPT_TOKENS,
            OUTPUT_TOKENS,
        )
    assert (_timeline(plain), _timeline(streamed)) == EXPECTED[engine]
    assert [r.timing for r in (plain, streamed)] == [
        "engine" if t != UNTIMED else "gateway" for t in EXPECTED[engine]
    ]
    sent = [r["body"] for r in fake.requests]
    assert all("priority" not in b and "cache_salt" not in b for b in sent)
    if engine == "trtllm":  # streamed upstream, to find its timings by the stream's id
        assert [b.get("stream") for b in sent] == [True, True]
        assert sent[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    usage_options = sent[1]["stream_options"]
    assert usage_options["include_usage"] is True
    assert usage_options.get("continuous_usage_stats", False) is (engine in ("trtllm", "sglang"))


def test_an_aborted_stream_without_usage_on_every_chunk_is_billed_what_it_streamed(fleet, engines):
    """TGI gives usage only at the end: a client that leaves mid-stream is
    billed the chunks relayed (one token each) and the gateway's estimate
    of the prompt, and the row says both were counted by the gateway."""
    fake = engines("tgi")
    fake.stream_as_asked, fake.chunk_seconds = True, 0.05
    fleet.add_tenant("a")
    fleet.add_replica("r", fake.base_url, "shared", engine="tgi")
    fleet.ready()
    stream = fleet.client("a").chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=200, stream=True
    )
    request_id = stream.headers["x-request-id"]
    parsed = stream.parse()
    for seen, _chunk in enumerate(parsed, start=1):
        if seen == 5:
            break
    parsed.response.close()
    record = wait_for_records([request_id], timeout=30)[request_id]
    assert record.status == "aborted"
    assert 5 <= record.completion_tokens < 200
    assert record.completion_tokens <= fake.served_output
    chars = len("hello") + 4  # the message and its overhead (gateway.payload)
    assert record.prompt_tokens == int(chars / float(fleet.model.chars_per_token)) + 1
    assert "prompt tokens estimated by the gateway" in record.error
    assert "output tokens counted by the chunks streamed" in record.error
    assert record.timing == "gateway"


def test_trtllm_timings_drained_by_another_reader_fall_back_to_the_gateways_window(fleet, engines):
    fake = engines("trtllm")
    fake.perf_lost = True
    fleet.add_tenant("a")
    fleet.add_replica("r", fake.base_url, "shared", engine="trtllm")
    fleet.ready()
    ids = _request_ids(fleet, "a")
    records = wait_for_records(ids)
    assert [(_timeline(records[i]), records[i].timing) for i in ids] == [(UNTIMED, "gateway")] * 2
    health = gateway_worker(fleet.gateway)
    assert health["perf_metrics_missed"] >= 2


def test_a_trtllm_replica_without_perf_metrics_is_asked_once_not_per_request(fleet, engines):
    """return_perf_metrics off: /perf_metrics is a 404, and its requests take
    the gateway's window at once rather than waiting for an entry."""
    fake = engines("trtllm")
    fake.perf_served = False
    fleet.add_tenant("a")
    fleet.add_replica("r", fake.base_url, "shared", engine="trtllm")
    fleet.ready()
    ids = _request_ids(fleet, "a") + _request_ids(fleet, "a")
    records = wait_for_records(ids)
    assert {records[i].timing for i in ids} == {"gateway"}
    assert fake.perf_reads == 1


@pytest.mark.parametrize("engine", ["trtllm", "nim", "tgi", "sglang"])
def test_reconciliation_balances_against_each_engines_own_counters(fleet, engines, engine):
    fake = engines(engine)
    fleet.add_tenant("a")
    replica = fleet.add_replica("r", fake.base_url, "shared", engine=engine)
    fleet.ready()
    before = replica_scrape(replica=replica)
    ids = _request_ids(fleet, "a") + _request_ids(fleet, "a")
    wait_for_records(ids)
    after = replica_scrape(replica=replica)
    assert after.prompt_tokens_total - before.prompt_tokens_total == 4 * PROMPT_TOKENS
    gap = reconciliation_compute(
        replica=replica, start=before.scraped_at, end=timezone.now() + timedelta(seconds=1)
    )
    assert (gap.vllm_prompt_tokens, gap.vllm_generation_tokens) == (28, 12)
    assert (gap.metered_prompt_tokens, gap.metered_generation_tokens) == (28, 12)


@pytest.mark.parametrize("engine", ["triton", "openai"])
def test_an_engine_without_token_counters_is_scraped_for_liveness_only(fleet, engines, engine):
    fake = engines(engine)
    fleet.add_tenant("a")
    replica = fleet.add_replica("r", fake.base_url, "shared", engine=engine)
    sample = replica_scrape(replica=replica)
    assert sample.up and sample.prompt_tokens_total is None
    fake.stop()
    assert not replica_scrape(replica=replica).up


def test_an_answer_ends_only_once_its_record_is_kept(fleet, engines, tmp_path):
    """The last bytes of an answer leave the gateway only after its record
    is in the spool, so a gateway killed the moment its client has the
    answer has kept it. TensorRT-LLM's timings drained by another reader
    make the widest window: the gateway looks for them for up to a second
    before it makes the record (before, the client had its answer all that
    while, and a kill then lost the request)."""
    fake = engines("trtllm")
    fake.perf_lost = True
    fleet.add_tenant("a")
    fleet.add_replica("r", fake.base_url, "shared", engine="trtllm")
    env = {"GATEWAY_RECORD_FLUSH_SECONDS": "30", "GATEWAY_SPOOL_DIR": str(tmp_path / "spool")}
    proc, url = start_gateway(env=env)
    try:
        wait_for_fleet(url, replicas=1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0)
        answer = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=HELLO, max_tokens=3
        )
        assert answer.parse().usage.completion_tokens == OUTPUT_TOKENS
    finally:
        os.kill(proc.pid, signal.SIGKILL)  # the moment the answer is in: nothing flushed
        proc.wait(timeout=10)
    request_id = answer.headers["x-request-id"]
    assert not UsageEvent.objects.filter(request_id=request_id).exists()

    proc, url = start_gateway(env={**env, "GATEWAY_RECORD_FLUSH_SECONDS": "0.1"})
    try:
        record = wait_for_records([request_id])[request_id]
    finally:
        stop_gateway(proc)
    assert (record.completion_tokens, record.timing) == (OUTPUT_TOKENS, "gateway")
