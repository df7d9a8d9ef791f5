"""The gateway's record sink: completed requests land in the ledger with
every timing, the gateway's queue time among them (null when a record has
none); a bad one rejects the flush naming the field."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from metering.ledger import BatchRejected
from metering.models import UsageEvent
from metering.sink import usage_event_sink
from serving.records import CompletedRequest
from tests.metering.conftest import T0


def completed(ledger, request_id: str, **fields) -> CompletedRequest:
    values = {
        "request_id": request_id,
        "tenant_id": ledger.a.pk,
        "api_key_id": None,
        "model": ledger.model.name,
        "received_at": T0,
        "ended_at": T0 + timedelta(seconds=1),
        "status": "ok",
        "http_status": 200,
        "replica_id": ledger.replica.pk,
        "sent_at": T0 + timedelta(milliseconds=250),
        "prompt_tokens": 20,
        "completion_tokens": 10,
        "queue_ms": Decimal("3.5"),
    }
    return CompletedRequest(**(values | fields))


def test_the_gateway_queue_time_lands_in_the_ledger_beside_vllms(ledger):
    usage_event_sink(
        [
            completed(ledger, "queued", gateway_queue_ms=Decimal("249.8766")),
            completed(ledger, "straight", gateway_queue_ms=Decimal("0")),
            completed(ledger, "older"),  # a record from before the field: not measured
        ]
    )
    rows = {e.request_id: e for e in UsageEvent.objects.all()}
    assert rows["queued"].gateway_queue_ms == Decimal("249.877")  # to the microsecond
    assert rows["queued"].queue_ms == Decimal("3.500")  # vLLM's own stays apart
    assert rows["straight"].gateway_queue_ms == Decimal("0.000")
    assert rows["older"].gateway_queue_ms is None
    assert {e.source for e in rows.values()} == {"gateway"}


def test_a_negative_gateway_queue_time_rejects_the_flush_naming_it(ledger):
    with pytest.raises(BatchRejected) as rejected:
        usage_event_sink(
            [completed(ledger, "fine"), completed(ledger, "bad", gateway_queue_ms=Decimal("-1"))]
        )
    (error,) = rejected.value.errors
    assert (error.index, error.field) == (1, "gateway_queue_ms")
    assert not UsageEvent.objects.exists()
