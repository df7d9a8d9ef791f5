"""A disaggregated pool through the real gateway, against replicas that
record what they were sent: the prefill asked for one token with vLLM's
kv_transfer_params, the decode sent the request with what the prefill
answered; a ledger row per phase under one request id; the client sees
the decode's answer, or the prefill's refusal."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from metering.models import UsageEvent
from metering.selectors.requests import request_get
from serving.tiny_model import MODEL_NAME
from tests.fleet import gateway_worker, wait_for_records
from tests.gateway.fake_upstream import FakeUpstream

HELLO = [{"role": "user", "content": "hello"}]
HANDOFF = {"remote_engine_id": "prefill-1", "remote_block_ids": [3, 4], "remote_host": "10.0.0.7"}


@pytest.fixture
def pair():
    prefill, decode = FakeUpstream().start(), FakeUpstream().start()
    prefill.kv_transfer_answer = HANDOFF
    yield prefill, decode
    prefill.stop()
    decode.stop()


def _disaggregated(fleet, pair):
    prefill, decode = pair
    fleet.add_tenant("a")
    fleet.add_replica("p1", prefill.base_url, "disagg", role="prefill")
    fleet.add_replica("d1", decode.base_url, "disagg", role="decode")
    fleet.ready()


def _rows(request_id: str, *, timeout: float = 10) -> dict[str, UsageEvent]:
    """The request's rows by phase, once both are in (or `timeout` passed)."""
    deadline = time.monotonic() + timeout
    while True:
        rows = {r.phase: r for r in UsageEvent.objects.filter(request_id=request_id)}
        if len(rows) == 2 or time.monotonic() > deadline:
            return rows
        time.sleep(0.05)


@pytest.mark.parametrize("stream", [False, True])
def test_prefill_then_decode_a_row_each_under_one_request_id(fleet, pair, stream):
    _disaggregated(fleet, pair)
    prefill, decode = pair
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    raw = fleet.client("a").chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_completion_tokens=20, stream=stream, **usage
    )
    answer = raw.parse()
    chunks = list(answer) if stream else [answer]
    assert chunks[-1].usage.completion_tokens == 3  # the decode's answer reached the client

    (asked_prefill,) = [r["body"] for r in prefill.requests]
    assert asked_prefill["max_tokens"] == 1 and "max_completion_tokens" not in asked_prefill
    assert asked_prefill["stream"] is False and "stream_options" not in asked_prefill
    assert asked_prefill["kv_transfer_params"]["do_remote_decode"] is True
    (asked_decode,) = [r["body"] for r in decode.requests]
    assert asked_decode["kv_transfer_params"] == HANDOFF
    assert asked_decode["max_completion_tokens"] == 20 and asked_decode["stream"] is stream

    request_id = raw.headers["x-request-id"]
    rows = _rows(request_id)
    assert set(rows) == {"prefill", "decode"}
    assert rows["prefill"].replica_id == fleet.replicas["p1"].pk
    assert rows["decode"].replica_id == fleet.replicas["d1"].pk
    assert [rows[p].status for p in ("prefill", "decode")] == ["ok", "ok"]
    assert rows["prefill"].timing == "engine"  # its own timings, from its own answer
    # The request's page reads it by the answer the client got.
    assert request_get(tenant=None, request_id=request_id).phase == "decode"


def test_a_prefill_refusal_is_the_clients_and_no_decode_runs(fleet, pair):
    _disaggregated(fleet, pair)
    prefill, decode = pair
    prefill.mode = "bad_request"
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("a").chat.completions.create(model=MODEL_NAME, messages=HELLO)
    assert decode.requests == []
    request_id = refused.value.response.headers["x-request-id"]
    row = wait_for_records([request_id])[request_id]
    assert (row.phase, row.status, row.http_status) == ("prefill", "error", 400)
    assert UsageEvent.objects.filter(request_id=request_id).count() == 1


def test_a_failing_prefill_replica_is_recorded_as_its_phase_never_dead_lettered(fleet, pair):
    _disaggregated(fleet, pair)
    prefill, decode = pair
    prefill.mode = "error500"
    with pytest.raises(openai.InternalServerError) as failed:
        fleet.client("a").chat.completions.create(model=MODEL_NAME, messages=HELLO)
    assert failed.value.status_code == 503 and decode.requests == []
    request_id = failed.value.response.headers["x-request-id"]
    row = wait_for_records([request_id])[request_id]
    assert (row.phase, row.status, row.http_status) == ("prefill", "error", 503)
    assert row.replica_id == fleet.replicas["p1"].pk
    health = gateway_worker(fleet.gateway)
    assert health["records_dead_lettered"] == 0


def test_a_pool_with_no_decode_replica_is_a_503_and_nothing_runs(fleet, pair):
    prefill, _decode = pair
    fleet.add_tenant("a")
    fleet.add_replica("p1", prefill.base_url, "disagg", role="prefill")
    fleet.ready()
    with pytest.raises(openai.InternalServerError) as failed:
        fleet.client("a").chat.completions.create(model=MODEL_NAME, messages=HELLO)
    assert failed.value.status_code == 503
    assert prefill.requests == []
    # Recorded as what it was, a request for a prefill replica that never
    # ran (never dead-lettered as a whole request there).
    request_id = failed.value.response.headers["x-request-id"]
    row = wait_for_records([request_id])[request_id]
    assert (row.phase, row.status, row.http_status) == ("prefill", "error", 503)
    health = gateway_worker(fleet.gateway)
    assert health["records_dead_lettered"] == 0


def test_each_side_of_a_disaggregated_pool_keeps_its_own_max_inflight(fleet, pair):
    """Fair queuing: the prefill's slot is given back when it ends and the
    decode waits for a slot on a decode replica, so a decode replica never
    holds more than its max_inflight however many prefills run."""
    prefill, decode = pair
    decode.delay = 0.3
    fleet.add_tenant("a")
    fleet.add_replica("p1", prefill.base_url, "disagg", role="prefill", max_inflight=4)
    fleet.add_replica("d1", decode.base_url, "disagg", role="decode", max_inflight=1)
    fleet.ready()
    client = fleet.client("a", timeout=30)
    with ThreadPoolExecutor(max_workers=3) as pool:
        answers = list(
            pool.map(
                lambda _: client.chat.completions.create(model=MODEL_NAME, messages=HELLO),
                range(3),
            )
        )
    assert [a.usage.completion_tokens for a in answers] == [3, 3, 3]
    assert len(prefill.requests) == len(decode.requests) == 3
    assert decode.inflight_max == 1
