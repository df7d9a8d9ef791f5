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


def test_each_replica_is_reconciled_by_its_engine_and_shows_what_the_gateway_timed(ledger, client):
    from metering.jobs import metering_run
    from metering.selectors.reconciliation import reconciliation_by_replica
    from serving.models import Replica
    from tests.factories import make_finance_user

    Replica.objects.filter(pk=ledger.replica.pk).update(engine="vllm")
    other = Replica.objects.exclude(pk=ledger.replica.pk).get()
    Replica.objects.filter(pk=other.pk).update(engine="openai")
    untimed = {"queue_ms": None, "ttft_ms": None, "generation_ms": None, "replica_id": other.pk}
    usage_record_batch(
        events=[
            ledger.event("v1"),
            ledger.event("o1", **untimed),
            ledger.event("o2", at=T0 + timedelta(seconds=5), **untimed),
        ],
        source=EventSource.API,
    )
    sample(ledger.replica, T0 - timedelta(seconds=5), 0, 0)
    sample(ledger.replica, T0 + timedelta(seconds=30), 20, 10)
    reconciliation_compute(replica=ledger.replica, start=T0, end=T0 + timedelta(hours=1))
    metering_run(now=T0 + timedelta(hours=3))

    rows = {
        row["replica"]: row
        for row in reconciliation_by_replica(start=T0, end=T0 + timedelta(hours=1))
    }
    vllm, openai = rows[ledger.replica.name], rows[other.name]
    assert (vllm["engine"], vllm["counters"], vllm["windows"], vllm["prompt_gap"]) == (
        "vLLM",
        True,
        1,
        0,
    )
    assert (vllm["served"], vllm["gateway_timed"]) == (1, 0)
    assert (openai["counters"], openai["served"], openai["gateway_timed"]) == (False, 2, 2)
    assert "not reconciled" in openai["counters_note"]

    client.force_login(make_finance_user())
    html = client.get("/reconciliation/").content.decode()
    assert "Other OpenAI-compatible server" in html and "scraped for liveness only" in html
