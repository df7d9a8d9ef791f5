"""GET /api/v1/slo: a tenant reads its own SLO figures and never another
tenant's (by key or session; another's slug is not found); finance staff
read every tenant's or one. POST /api/v1/invoices/{id}/sla-credits:
finance only, drafts only."""

from __future__ import annotations

from datetime import timedelta

import pytest

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import SlaCreditAdjustment
from metering.choices import EventSource
from metering.ledger import usage_record_batch
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key
from tests.ledger import T0
from tests.slo import slo_day, slo_policy

URL = "/api/v1/slo"
RANGE = {"start": "2026-10-05", "end": "2026-10-06"}


@pytest.fixture
def measured(ledger, world_a, world_b):
    """Alpha: the day of tests/slo.py; Bravo: one request, a 503."""
    slo_policy()
    slo_day(ledger, world_a.tenant, T0)
    usage_record_batch(
        events=[
            ledger.event("b-503", tenant=world_b.tenant, status="error", http_status=503,
                         first_token_at=None),
        ],
        source=EventSource.API,
    )  # fmt: skip
    return ledger


def test_a_tenant_reads_only_its_own_figures(measured, world_a, world_b):
    _, secret = make_key(world_a.tenant, scopes=["usage:read"])
    alpha = client_for_key(secret)
    body = alpha.get(URL, RANGE).json()
    (mine,) = body["tenants"]
    assert (mine["tenant"], mine["tier"], mine["policy"]["name"]) == (
        world_a.tenant.slug,
        "shared",
        "shared default",
    )
    period = mine["period"]
    assert (period["requests"], period["failed"], period["timed"]) == (24, 3, 20)
    assert period["availability_percent"] == "87.5000"
    assert (period["ttft_p95_ms"], period["itl_p95_ms"]) == ("190.500", "190.500")
    assert period["breached"] is True
    assert {m["metric"]: m["met"] for m in period["metrics"]} == {
        "availability": False,
        "ttft_p95": False,
        "itl_p95": None,  # no target
    }
    assert [d["day"] for d in mine["days"]] == ["2026-10-05"]
    # Another tenant's figures: not found, by slug or otherwise.
    assert alpha.get(URL, RANGE | {"tenant": world_b.tenant.slug}).status_code == 404
    assert world_b.tenant.slug not in alpha.get(URL, RANGE).content.decode()
    # A member's session reads the same, its own only.
    session = client_for_user(world_b.viewer.user).get(URL, RANGE).json()
    assert [t["tenant"] for t in session["tenants"]] == [world_b.tenant.slug]
    assert session["tenants"][0]["period"]["availability_percent"] == "0.0000"
    # Without usage:read: refused.
    _, billing_only = make_key(world_a.tenant, scopes=["billing:read"])
    assert client_for_key(billing_only).get(URL, RANGE).status_code == 403


def test_finance_reads_every_tenant_or_one(measured, world_a, world_b):
    finance = client_for_user(make_finance_user())
    body = finance.get(URL, RANGE).json()
    assert sorted(t["tenant"] for t in body["tenants"]) == sorted(
        [world_a.tenant.slug, world_b.tenant.slug]
    )  # tenants with requests in the range
    (one,) = finance.get(URL, RANGE | {"tenant": world_b.tenant.slug}).json()["tenants"]
    assert (one["tenant"], one["period"]["failed"]) == (world_b.tenant.slug, 1)


def test_bad_ranges_are_named(measured, world_a):
    finance = client_for_user(make_finance_user())
    response = finance.get(URL, {"start": "2026-10-06", "end": "2026-10-05"})
    assert response.status_code == 400 and "end" in response.content.decode()
    response = finance.get(URL, {"start": "2026-01-01", "end": "2026-10-05"})
    assert response.status_code == 400 and "93 days" in response.content.decode()


def test_finance_waives_a_drafts_credit_and_nobody_else_can(world, measured, world_a):
    world.price()
    world.tokens(world_a.tenant, hour=OCT + timedelta(hours=1), completion=2_500_000)  # $10
    draft, _ = invoice_draft_build(tenant=world_a.tenant, period_start=OCT, period_end=NOV)
    url = f"/api/v1/invoices/{draft.pk}/sla-credits"
    body = {"metric": "availability", "action": "waive", "reason": "our maintenance"}
    _, secret = make_key(world_a.tenant)
    assert client_for_key(secret).post(url, body, format="json").status_code == 403
    owner = client_for_user(world_a.owner.user)
    assert owner.post(url, body, format="json").status_code == 403

    user = make_finance_user()
    finance = client_for_user(user)
    response = finance.post(url, body, format="json")
    assert response.status_code == 201
    out = response.json()
    assert out["adjustment"]["created_by"] == user.get_username()
    assert out["adjustment"]["reason"] == "our maintenance"
    assert [line["sla_metric"] for line in out["invoice"]["lines"] if line["sla_metric"]] == [
        "ttft_p95"
    ]
    assert out["invoice"]["total_minor"] == 1000 - 50
    assert [row["action"] for row in finance.get(url).json()] == ["waive"]

    invoice_finalize(invoice_id=draft.pk)
    refused = finance.post(url, body | {"action": "adjust", "credit_percent": "5"}, format="json")
    assert refused.status_code == 409
    assert SlaCreditAdjustment.objects.count() == 1
