"""The rows of a request a Dynamo frontend placed on its workers
(gateway.worker_rows), the workers its /health lists
(serving.engine_workers.workers_listed), and the worker ids its nvext names
(serving.engines): worked examples, no processes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from gateway.fleet import ReplicaInfo
from gateway.worker_rows import worker_rows
from serving.engines import WorkerSplit, engine_spec, workers_listed
from serving.records import CompletedRequest

T0 = datetime(2026, 11, 28, 12, tzinfo=UTC)
FRONT = 1


def _worker(pk: int, role: str) -> ReplicaInfo:
    return ReplicaInfo(
        id=pk, name=f"w{pk}", base_url="http://127.0.0.1:9", model="m", pool_id=5,
        pool_kind="shared", pool_owner_id=None, max_inflight=8, engine="dynamo", role=role,
        front_id=FRONT, engine_instance=str(pk * 1000),
    )  # fmt: skip


WORKERS = {
    (FRONT, "2000"): _worker(2, "prefill"),
    (FRONT, "3000"): _worker(3, "decode"),
    (FRONT, "4000"): _worker(4, "both"),
}


def _record() -> CompletedRequest:
    return CompletedRequest(
        request_id="r1", tenant_id=7, api_key_id=None, model="m", received_at=T0,
        ended_at=T0 + timedelta(milliseconds=500), status="ok", http_status=200,
        replica_id=FRONT, pool_id=5, prompt_tokens=40, completion_tokens=9,
        sent_at=T0 + timedelta(milliseconds=10), first_token_at=T0 + timedelta(milliseconds=60),
        queue_ms=Decimal("2.000"), gateway_queue_ms=Decimal("1.500"),
        ttft_ms=Decimal("30.000"), generation_ms=Decimal("400.000"),
    )  # fmt: skip


def _of(front: int, instance: str) -> ReplicaInfo | None:
    return WORKERS.get((front, instance))


def test_a_disaggregated_request_is_a_prefill_row_and_a_decode_row_on_their_workers():
    split = WorkerSplit(prefill="2000", decode="3000", prefill_ms=Decimal("18.5004"))
    prefill, decode = worker_rows(_record(), split, _of)
    assert (prefill.phase, prefill.replica_id, decode.phase, decode.replica_id) == (
        "prefill", 2, "decode", 3,
    )  # fmt: skip
    assert (prefill.prompt_tokens, prefill.completion_tokens) == (40, 0)
    assert (decode.prompt_tokens, decode.completion_tokens) == (40, 9)
    # The prefill: its wait, then its prefill; it ends there.
    assert (prefill.queue_ms, prefill.ttft_ms, prefill.generation_ms) == (
        Decimal("2.000"), Decimal("18.500"), Decimal(0),
    )  # fmt: skip
    assert prefill.ended_at == prefill.first_token_at == T0 + timedelta(microseconds=30_500)
    assert prefill.gateway_queue_ms is None and decode.gateway_queue_ms == Decimal("1.500")
    # The decode: everything before it queued, the rest of the TTFT (KV
    # transfer, first step) its own; the same total as the engine said.
    assert (decode.queue_ms, decode.ttft_ms, decode.generation_ms) == (
        Decimal("20.500"), Decimal("11.500"), Decimal("400.000"),
    )  # fmt: skip
    assert decode.queue_ms + decode.ttft_ms == Decimal("2.000") + Decimal("30.000")
    assert decode.ended_at == T0 + timedelta(milliseconds=500)


def test_an_aggregated_request_is_one_row_on_its_worker():
    (row,) = worker_rows(_record(), WorkerSplit(prefill="4000", decode="4000"), _of)
    assert (row.phase, row.replica_id, row.queue_ms, row.ttft_ms) == (
        "whole", 4, Decimal("2.000"), Decimal("30.000"),
    )  # fmt: skip


def test_a_worker_not_registered_or_of_another_role_leaves_the_row_on_the_frontend():
    for split in (
        WorkerSplit(prefill="2000", decode="9999", prefill_ms=Decimal(5)),  # decode unknown
        WorkerSplit(prefill="9999", decode="3000", prefill_ms=Decimal(5)),  # prefill unknown
        WorkerSplit(prefill="4000", decode="3000", prefill_ms=Decimal(5)),  # not a prefill worker
        WorkerSplit(prefill="2000", decode="3000"),  # no prefill time: nothing to cut by
        WorkerSplit(prefill="3000", decode="3000"),  # a decode worker ran it whole?
    ):
        (row,) = worker_rows(_record(), split, _of)
        assert (row.phase, row.replica_id) == ("whole", FRONT), split
    (row,) = worker_rows(_record(), None, _of)
    assert row.replica_id == FRONT


def test_dynamo_nvext_names_the_workers_as_text():
    read = engine_spec("dynamo").timings
    nvext = {
        "worker_id": {"prefill_worker_id": 11474219997882714222, "decode_worker_id": 17},
        "timing": {"prefill_wait_time_ms": 0.5, "prefill_time_ms": 19.04, "ttft_ms": 19.8,
                   "total_time_ms": 61.5},
    }  # fmt: skip
    timings = read({"nvext": nvext}, {})
    assert timings.workers == WorkerSplit("11474219997882714222", "17", Decimal("19.04"))
    alone = read({"nvext": {"worker_id": {"decode_worker_id": 17}}}, {})
    assert alone.workers == WorkerSplit("17", "17") and not alone.any
    assert read({"nvext": {"worker_id": {"decode_worker_id": True}}}, {}).workers is None


def test_the_workers_a_frontend_lists_and_their_roles():
    def instance(component, endpoint, instance_id):
        return {"component": component, "endpoint": endpoint, "instance_id": instance_id}

    split = {
        "instances": [
            instance("backend", "generate", 17),
            instance("backend", "clear_kv_blocks", 17),
            instance("prefill", "generate", 11474219997882714222),
            instance("prefill", "worker_kv_query", 11474219997882714222),
            instance("backend", "generate", -1),  # not an id
        ]
    }
    assert [(w.instance, w.role) for w in workers_listed(split)] == [
        ("11474219997882714222", "prefill"),
        ("17", "decode"),
    ]
    aggregated = {"instances": [instance("backend", "generate", 17)]}
    assert [(w.instance, w.role) for w in workers_listed(aggregated)] == [("17", "both")]
    assert workers_listed({}) == []
