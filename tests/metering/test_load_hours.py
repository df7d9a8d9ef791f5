"""Each replica's load and latency per hour (ReplicaLoadHour), rebuilt by
the metering run from the ledger with the hour's rollups: what planning
measures capacity at an SLO from."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.models import ReplicaLoadHour
from tests.metering.conftest import T0


def test_the_metering_run_rolls_each_replicas_hour_of_load_and_latency(ledger):
    """Twenty requests on `replica` in one hour, the n-th waiting 100 + 10n
    ms for its first token after being received (sent 50 ms after) and
    ending 1 s after being sent with 11 tokens (10 gaps): inter-token
    (900 - 10n) / 10 ms. A refused request and a request on the other
    replica count elsewhere or not at all; an aborted one counts its
    tokens and time, not a latency."""
    events = []
    for n in range(20):
        at = T0 + timedelta(minutes=2 * n)
        events.append(
            ledger.event(
                f"r{n}",
                at=at,
                sent_at=at + timedelta(milliseconds=50),
                first_token_at=at + timedelta(milliseconds=100 + 10 * n),
                ended_at=at + timedelta(milliseconds=1050),
                completion_tokens=11,
                tenant=ledger.a if n % 2 else ledger.b,
            )
        )
    events.append(
        ledger.event(
            "gone",
            at=T0,
            sent_at=T0,
            ended_at=T0 + timedelta(seconds=2),
            status="aborted",
            http_status=499,
            first_token_at=None,
        )
    )
    events.append(ledger.event("other", replica_id=ledger.other_replica.pk))
    events.append(
        ledger.event(
            "refused",
            replica_id=None,
            status="rejected",
            http_status=429,
            sent_at=None,
            first_token_at=None,
            ended_at=T0,
        )
    )
    usage_record_batch(events=events, source=EventSource.API)
    metering_run(now=T0 + timedelta(hours=2))

    row = ReplicaLoadHour.objects.get(replica=ledger.replica)
    assert row.hour == T0.replace(minute=0)
    assert (row.requests, row.tokens) == (20, 20 * 31 + 30)  # 20 + 11 each, the aborted's 20 + 10
    assert row.busy_seconds == Decimal("22.000")  # 20 x 1 s from being sent, and 2 s
    # TTFT from received: 100..290 ms; p95 interpolated between 280 and 290.
    assert row.ttft_p95_ms == Decimal("280.500")
    # Inter-token: (1050 - 100 - 10n) / 10 = 95 - n ms; p95 of 76..95.
    assert row.itl_p95_ms == Decimal("94.050")
    assert (row.pool_id, row.served_model_id) == (ledger.replica.pool_id, ledger.model.pk)
    other = ReplicaLoadHour.objects.get(replica=ledger.other_replica)
    assert other.requests == 1
    assert ReplicaLoadHour.objects.count() == 2  # the refused one is no replica's load
