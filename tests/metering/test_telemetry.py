"""The platform's /metrics: attribution lag, pending work, reconciliation
gaps; guarded by a token when one is configured."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client.parser import text_string_to_metric_families

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from metering.models import ReconciliationGap
from tests.metering.conftest import T0


def scrape(client, **headers) -> dict:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.content.decode())
        for s in family.samples
    }


def test_lag_pending_work_and_gaps(ledger, client):
    usage_record_batch(events=[ledger.event("x")], source=EventSource.API)
    ReconciliationGap.objects.create(
        replica=ledger.replica,
        start=T0,
        end=T0 + timedelta(hours=1),
        vllm_prompt_tokens=120,
        vllm_generation_tokens=60,
        metered_prompt_tokens=100,
        metered_generation_tokens=60,
        samples=240,
        computed_at=T0 + timedelta(hours=1),
    )
    metrics = scrape(client)
    assert metrics[("metering_windows_pending", ())] == 1
    assert metrics[("metering_hours_dirty", ())] == 1
    assert metrics[("metering_attribution_lag_seconds", ())] > 3600  # T0's hour closed long ago
    gap = (("kind", "prompt"), ("replica", ledger.replica.name))
    assert metrics[("metering_reconciliation_gap_tokens", gap)] == 20


def test_a_configured_token_is_required(db, client, settings):
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics").status_code == 401
    assert scrape(client, Authorization="Bearer s3cret")[("metering_windows_pending", ())] == 0


def test_without_a_token_only_this_machine_is_answered(db, client, settings):
    """Issue 60, finding 8: /metrics names tenants' spend drift, replicas
    and jobs; on the public port, with no token set, a caller from another
    address is refused and told how to open it."""
    settings.METRICS_TOKEN = ""
    refused = client.get("/metrics", REMOTE_ADDR="203.0.113.7")
    assert refused.status_code == 403 and "METRICS_TOKEN" in refused.json()["error"]["message"]
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 200
    settings.METRICS_TOKEN = "s3cret"
    assert client.get("/metrics", REMOTE_ADDR="203.0.113.7").status_code == 401
    wrong = client.get("/metrics", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION="Bearer s3cre")
    assert wrong.status_code == 401
    right = client.get("/metrics", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION="Bearer s3cret")
    assert right.status_code == 200
