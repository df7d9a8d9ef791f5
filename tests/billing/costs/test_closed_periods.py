"""Closed cost periods: once October is invoiced, a cost
rate taking effect in October is a 409 naming the closed period, through
the API and the admin alike, and nothing is written; finance reopens the
month with a reason (who and when recorded), then the rate is accepted.
Rates after the close, and what-if scenarios, need no reopening."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.costs.scenarios import cost_scenario_create
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import CostPeriodReopening, CostRate
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

RATES = "/api/v1/costs/rates"
BACKDATED = {
    "component": "support",
    "basis": "per_gpu_month",
    "amount": "1000",
    "currency": "USD",
    "effective_from": "2026-10-01T00:00:00Z",
}


@pytest.fixture
def invoiced(world):
    """October invoiced for a USD and a EUR tenant."""
    world.price()
    world.price(currency="EUR")  # Euro Co's book
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    for tenant in (world.a, euro):
        world.tokens(tenant, hour=OCT + timedelta(hours=2), completion=1_000_000)
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        invoice_finalize(invoice_id=draft.pk)
    return world


@pytest.fixture
def finance_user(db):
    return make_finance_user()


def test_a_rate_backdated_into_an_invoiced_month_is_409_until_finance_reopens_it(
    invoiced, finance_user
):
    finance = client_for_user(finance_user)

    refused = finance.post(RATES, BACKDATED, format="json")
    assert refused.status_code == 409, refused.json()
    error = refused.json()["error"]
    assert error["code"] == "cost_period_closed"
    assert "2026-10-01 00:00 UTC is inside the closed cost period" in error["message"]
    assert "invoiced up to 2026-11-01 00:00 UTC" in error["message"]
    assert not CostRate.objects.exists()

    no_reason = finance.post(
        "/api/v1/costs/reopenings",
        {"start": "2026-10-01", "end": "2026-11-01", "reason": "  "},
        format="json",
    )
    assert no_reason.status_code == 400 and no_reason.json()["error"]["field"] == "reason"
    reopened = finance.post(
        "/api/v1/costs/reopenings",
        {"start": "2026-10-01", "end": "2026-11-01", "reason": "support contract signed late"},
        format="json",
    )
    assert reopened.status_code == 201, reopened.json()
    record = CostPeriodReopening.objects.get()
    assert (record.reason, record.reopened_by) == ("support contract signed late", finance_user)
    assert record.reopened_at is not None
    assert finance.get("/api/v1/costs/reopenings").json()[0]["reopened_by"] == (
        finance_user.username
    )

    accepted = finance.post(RATES, BACKDATED, format="json")
    assert accepted.status_code == 201, accepted.json()
    # September stays closed: the reopening covers October only.
    september = finance.post(
        RATES, BACKDATED | {"component": "network", "effective_from": "2026-09-15"}, format="json"
    )
    assert september.status_code == 409


def test_a_rate_from_after_the_invoiced_periods_needs_no_reopening(invoiced, finance_user):
    finance = client_for_user(finance_user)
    later = BACKDATED | {"effective_from": "2026-11-01T00:00:00Z"}
    assert finance.post(RATES, later, format="json").status_code == 201


def test_reopening_what_is_not_closed_is_refused(invoiced, finance_user):
    finance = client_for_user(finance_user)
    response = finance.post(
        "/api/v1/costs/reopenings",
        {"start": "2026-11-01", "end": "2026-12-01", "reason": "why not"},
        format="json",
    )
    assert response.status_code == 400 and response.json()["error"]["field"] == "start"
    assert not CostPeriodReopening.objects.exists()


def test_the_admin_shows_the_closed_period_on_the_field_and_writes_nothing(
    invoiced, finance_user, client
):
    finance_user.is_staff = finance_user.is_superuser = True
    finance_user.save()
    client.force_login(finance_user)
    form = {
        "component": "support",
        "basis": "per_gpu_month",
        "amount": "1000",
        "currency": "USD",
        "hour_from": "0",
        "hour_to": "24",
        "effective_from_0": "2026-10-01",
        "effective_from_1": "00:00:00",
        "note": "",
    }
    response = client.post("/admin/billing/costrate/add/", form)
    assert response.status_code == 200  # the form again, with the error on its field
    assert "inside the closed cost period" in response.content.decode()
    assert not CostRate.objects.exists()


def test_a_what_if_scenario_may_price_a_closed_month(invoiced):
    scenario, _ = cost_scenario_create(
        name="cheaper support",
        start=OCT,
        end=NOV,
        rates=[
            {
                "component": "support",
                "basis": "per_gpu_month",
                "amount": Decimal(500),
                "effective_from": datetime(2026, 10, 1, tzinfo=UTC),
            }
        ],
    )
    assert CostRate.objects.filter(scenario=scenario).count() == 1
