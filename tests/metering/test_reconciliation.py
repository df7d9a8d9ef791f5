"""Reconciliation arithmetic on stored samples: counter deltas (with a
restart), metered tokens in the same span, the gap."""

from __future__ import annotations

from datetime import timedelta

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from metering.reconciliation import counter_delta, reconciliation_compute
from serving.models import ReplicaMetricSample
from tests.metering.conftest import T0


def sample(replica, at, prompt, generation, up=True):
    ReplicaMetricSample.objects.create(
        replica=replica,
        scraped_at=at,
        up=up,
        prompt_tokens_total=prompt if up else None,
        generation_tokens_total=generation if up else None,
    )


def test_counter_deltas_survive_a_restart(ledger):
    r = ledger.replica
    sample(r, T0 - timedelta(seconds=10), 1_000, 500)  # the baseline before the window
    sample(r, T0 + timedelta(seconds=20), 1_100, 560)
    sample(r, T0 + timedelta(seconds=35), 0, 0, up=False)  # down: ignored
    sample(r, T0 + timedelta(seconds=50), 40, 10)  # restarted: 40 and 10 are new
    delta = counter_delta(replica_id=r.pk, start=T0, end=T0 + timedelta(minutes=1))
    assert (delta.prompt, delta.generation, delta.samples) == (140, 70, 3)


def test_gap_is_what_vllm_served_beyond_the_ledger(ledger):
    r = ledger.replica
    sample(r, T0 - timedelta(seconds=5), 0, 0)
    sample(r, T0 + timedelta(seconds=30), 20 * 3, 10 * 3)  # three requests served
    usage_record_batch(
        events=[ledger.event("m1"), ledger.event("m2", tenant=ledger.b)],  # one record lost
        source=EventSource.API,
    )
    gap = reconciliation_compute(replica=r, start=T0, end=T0 + timedelta(minutes=1))
    assert (gap.vllm_prompt_tokens, gap.metered_prompt_tokens) == (60, 40)
    assert (gap.prompt_gap, gap.generation_gap) == (20, 10)
    # Recomputing replaces the row.
    reconciliation_compute(replica=r, start=T0, end=T0 + timedelta(minutes=1))
    assert type(gap).objects.count() == 1
