"""Every datetime the API takes lies between 2000-01-01 and 2100-01-01:
outside that a request is a 400 naming the field, with nothing written
(a margin report for year 1 used to answer 500 with an OverflowError)."""

from __future__ import annotations

import pytest

from billing.models import AllocationRun, FxRate, InvoiceRun, MarginReport
from tenants.models import ApiKey
from tests.conftest import client_for_user
from tests.factories import make_finance_user

YEAR_ONE = {"start": "0001-01-01T00:00:00Z", "end": "0002-01-01T00:00:00Z"}


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


def _refused(response, field: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["field"] == field
    assert "between 2000-01-01 and 2100-01-01" in error["message"]


def test_a_margin_report_for_year_one_is_a_400_naming_start(finance):
    _refused(finance.post("/api/v1/margin-reports", YEAR_ONE, format="json"), "start")
    late = {"start": "2099-01-01T00:00:00Z", "end": "9999-12-31T23:59:59Z"}
    _refused(finance.post("/api/v1/margin-reports", late, format="json"), "end")
    assert not MarginReport.objects.exists()


def test_the_supported_span_itself_is_accepted(finance):
    edge = {"start": "2000-01-01T00:00:00Z", "end": "2100-01-01T00:00:00Z"}
    assert finance.post("/api/v1/margin-reports", edge, format="json").status_code == 202


def test_periods_out_of_range_are_refused_by_every_api_that_takes_one(finance, world_a, world_b):
    _refused(finance.get("/api/v1/usage", {"start": "0001-01-01", "end": "2026-01-01"}), "start")
    _refused(
        finance.get("/api/v1/usage/focus", {"start": "2026-01-01", "end": "9999-12-31"}), "end"
    )
    _refused(finance.get("/api/v1/costs/allocations", YEAR_ONE), "start")
    _refused(finance.post("/api/v1/costs/runs", YEAR_ONE, format="json"), "start")
    as_of = {"as_of": "0001-01-01T00:00:00+14:00"}
    _refused(finance.post("/api/v1/invoice-runs", as_of, format="json"), "as_of")
    rate = {
        "component": "colocation",
        "basis": "per_gpu_hour",
        "amount": "1",
        "effective_from": "1999-12-31",
    }
    _refused(finance.post("/api/v1/costs/rates", rate, format="json"), "effective_from")
    fx = {"base": "EUR", "quote": "USD", "date": "1999-12-31", "rate": "1.08"}
    _refused(finance.post("/api/v1/fx-rates", fx, format="json"), "date")
    _refused(finance.get("/api/v1/fx-rates", {"start": "0001-01-01"}), "start")
    assert not AllocationRun.objects.exists() and not InvoiceRun.objects.exists()
    assert not FxRate.objects.exists()

    owner = client_for_user(world_a.owner.user)
    key = {"name": "k", "scopes": ["usage:read"], "expires_at": "2200-01-01T00:00:00Z"}
    _refused(owner.post("/api/v1/api-keys", key, format="json"), "expires_at")
    assert ApiKey.objects.filter(tenant=world_a.tenant).count() == 1  # the fixture's own
