"""A request a frontend placed on workers of its own (NVIDIA Dynamo's), as
the ledger's rows on those workers, from what the frontend's answer said of
them (serving.engines.WorkerSplit): GPU-seconds and attribution per worker,
one request billed once.

- Aggregated (one worker ran it): its one row, on that worker.
- Disaggregated (a prefill worker, then a decode worker): a prefill row on
  the prefill worker (its prompt; from the request's start to the end of
  its prefill there: Dynamo's prefill wait, then prefill time) and a decode
  row on the decode worker (its output; its prompt, read as KV cache from
  the prefill worker, not billed again: metering.rollups), the decode's
  queue being everything before it (wait and prefill), its TTFT the KV
  transfer and first step, its generation the rest.
- A worker not registered (serving.engine_workers has not listed it yet),
  or one whose role does not fit: the row stays on the frontend, whole."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from decimal import Decimal

from gateway.fleet import ReplicaInfo
from gateway.outcome import ms
from metering.choices import Phase
from serving.choices import ReplicaRole
from serving.engines import WorkerSplit
from serving.records import CompletedRequest

WorkerOf = Callable[[int, str], ReplicaInfo | None]  # (frontend id, instance) -> worker


def worker_rows(
    record: CompletedRequest, workers: WorkerSplit | None, worker_of: WorkerOf
) -> list[CompletedRequest]:
    """The request's rows (the module's docstring); `record` with its ended_at set."""
    if workers is None or record.replica_id is None or record.phase != Phase.WHOLE:
        return [record]
    decode = worker_of(record.replica_id, workers.decode)
    if decode is None:
        return [record]
    if not workers.split:
        if decode.role != ReplicaRole.BOTH:
            return [record]
        record.replica_id, record.pool_id = decode.id, decode.pool_id
        return [record]
    prefill = worker_of(record.replica_id, workers.prefill)
    if (
        prefill is None
        or prefill.role != ReplicaRole.PREFILL
        or decode.role != ReplicaRole.DECODE
        or workers.prefill_ms is None
    ):
        return [record]
    waited, prefill_ms = record.queue_ms or Decimal(0), ms(workers.prefill_ms)
    before_decode = waited + prefill_ms
    prefill_end = record.ended_at
    if record.sent_at is not None:
        took = timedelta(microseconds=int(before_decode * 1000))
        prefill_end = min(prefill_end, record.sent_at + took)
    prefill_row = replace(
        record,
        phase=Phase.PREFILL,
        replica_id=prefill.id,
        pool_id=prefill.pool_id,
        completion_tokens=0,
        ttft_ms=prefill_ms,
        generation_ms=Decimal(0),
        first_token_at=prefill_end,
        ended_at=prefill_end,
        gateway_queue_ms=None,  # the request's, counted once: on its decode row
        extra=dict(record.extra),
    )
    record.phase = Phase.DECODE
    record.replica_id, record.pool_id = decode.id, decode.pool_id
    if record.ttft_ms is not None:
        record.queue_ms = before_decode
        record.ttft_ms = max(record.ttft_ms + waited - before_decode, Decimal(0))
    return [prefill_row, record]
