"""The rules DESIGN.md states hold for every way in (issue 59, item 5): a
date outside the supported span (2000-01-01 to 2100-01-01) is refused
naming its field by the API, the pages' forms and the admin alike; a
currency is ISO 4217 in the admin as in the API; a write that carries a
field the endpoint does not take is a 400 naming it, never ignored."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from billing import tasks
from billing.models import FxRate, InvoiceRun, PriceBook, TaxRate
from core.calendar import OUT_OF_RANGE
from serving.models import Gpu
from tenants.models import Tenant
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key

OUTSIDE = ["0001-01-01", "9999-12-31"]


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


def _error(response) -> tuple[str, str]:
    error = response.json()["error"]
    return error["field"], error["message"]


def _admin_add(client: Client, path: str, fields: dict):
    """POST an admin add form: its inlines' management forms as the add
    page gives them, with no inline row."""
    page = client.get(path).content.decode()
    management = {
        name: "0" if name.endswith(("TOTAL_FORMS", "INITIAL_FORMS")) else value
        for name, value in re.findall(
            r'name="([^"]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"[^>]*value="(\d*)"', page
        )
    }
    return client.post(path, {**management, **fields})


def _field_error(response, field: str) -> str:
    """The admin's error list on `field` (its row's text), or ""."""
    page = response.content.decode()
    row = re.search(rf'<div class="[^"]*field-{field}[^"]*">(.*?)</div>\s*</div>', page, re.S)
    return re.sub(r"<[^>]+>", " ", row.group(1)) if row else ""


# -- dates --------------------------------------------------------------------


@pytest.mark.parametrize("day", OUTSIDE)
def test_a_tax_rate_outside_the_span_is_refused_by_the_api_and_the_page(world, finance, day):
    rate = {"country": "FR", "name": "VAT", "percent": "20", "valid_from": day}

    refused = finance.post("/api/v1/tax/rates", rate, format="json")
    assert refused.status_code == 400
    assert _error(refused) == ("valid_from", f"valid_from: {OUT_OF_RANGE}")

    page = finance.post("/finance/tax/", {"action": "rate", **rate})
    assert page.status_code == 400
    assert f"valid_from: {OUT_OF_RANGE}" in page.content.decode()
    assert not TaxRate.objects.exists()


@pytest.mark.parametrize("day", OUTSIDE)
def test_a_tax_rate_outside_the_span_is_refused_by_the_admin(world, admin_client, day):
    rate = {"country": "FR", "name": "VAT", "percent": "20", "valid_from": day}

    response = admin_client.post("/admin/billing/taxrate/add/", rate)

    assert response.status_code == 200
    assert OUT_OF_RANGE in _field_error(response, "valid_from")
    assert not TaxRate.objects.exists()


@pytest.mark.parametrize("day", OUTSIDE)
def test_a_gpus_in_service_date_outside_the_span_is_refused_by_the_admin(world, admin_client, day):
    gpu = {
        "serial": "g-new",
        "sku": world.sku.pk,
        "node": world.node.pk,
        "in_service_date": day,
        "capex": "8760",
        "useful_life_months": "12",
        "salvage_value": "0",
        "currency": "USD",
    }

    refused = admin_client.post("/admin/serving/gpu/add/", gpu)

    assert refused.status_code == 200
    assert OUT_OF_RANGE in _field_error(refused, "in_service_date")
    assert not Gpu.objects.filter(serial="g-new").exists()
    done = admin_client.post("/admin/serving/gpu/add/", {**gpu, "in_service_date": "2026-01-01"})
    assert done.status_code == 302 and Gpu.objects.filter(serial="g-new").exists()


@pytest.mark.parametrize("day", OUTSIDE)
def test_a_price_books_effective_date_outside_the_span_is_refused_by_the_admin(
    world, admin_client, day
):
    book = {
        "name": "list",
        "version": "1",
        "tier": "",
        "currency": "USD",
        "effective_from_0": day,
        "effective_from_1": "00:00:00",
        "reservation_per_gpu_hour": "0",
        "dedicated_per_gpu_month": "0",
    }

    refused = _admin_add(admin_client, "/admin/billing/pricebook/add/", book)

    assert refused.status_code == 200
    assert OUT_OF_RANGE in _field_error(refused, "effective_from")
    assert not PriceBook.objects.exists()
    # A version takes effect from the current hour on (billing.pricing.catalog).
    done = _admin_add(
        admin_client, "/admin/billing/pricebook/add/", {**book, "effective_from_0": "2026-12-01"}
    )
    assert done.status_code == 302 and PriceBook.objects.count() == 1


@pytest.mark.parametrize("day", OUTSIDE)
def test_the_audit_filters_since_outside_the_span_is_a_400_naming_it(world, day):
    _, secret = make_key(world.a)
    api = client_for_key(secret)

    for path in ("/api/v1/audit/entries", "/api/v1/audit/export"):
        response = api.get(path, {"since": day})
        assert response.status_code == 400, path
        assert _error(response) == ("since", f"since: {OUT_OF_RANGE}")
    assert api.get("/api/v1/audit/entries", {"since": "2026-11-01"}).status_code == 200


# -- currencies ---------------------------------------------------------------


def test_a_tenants_billing_currency_is_iso_4217_in_the_admin_as_in_the_cost_api(
    world, admin_client, finance
):
    tenant = {"name": "Xyz Corp", "slug": "xyz", "tier": "shared", "status": "active"}

    refused = _admin_add(
        admin_client, "/admin/tenants/tenant/add/", {**tenant, "billing_currency": "XYZ"}
    )

    assert refused.status_code == 200
    assert "is not an ISO 4217 currency code" in _field_error(refused, "billing_currency")
    assert not Tenant.objects.filter(slug="xyz").exists()
    # What the cost-rate API says of the same code.
    rate = {
        "component": "energy",
        "basis": "per_kwh",
        "amount": "0.10",
        "currency": "XYZ",
        "effective_from": "2026-01-01T00:00:00Z",
    }
    api = finance.post("/api/v1/costs/rates", rate, format="json")
    assert api.status_code == 400 and api.json()["error"]["field"] == "currency"
    done = _admin_add(
        admin_client, "/admin/tenants/tenant/add/", {**tenant, "billing_currency": "JPY"}
    )
    assert done.status_code == 302
    assert Tenant.objects.get(slug="xyz").billing_currency == "JPY"


def test_an_fx_rates_currency_is_iso_4217_in_the_admin(world, admin_client):
    rate = {"base": "XYZ", "quote": "USD", "date": "2026-11-01", "rate": "1.1", "source": "t"}

    refused = admin_client.post("/admin/billing/fxrate/add/", rate)

    assert refused.status_code == 200
    assert "is not an ISO 4217 currency code" in _field_error(refused, "base")
    assert not FxRate.objects.exists()


# -- unknown fields -----------------------------------------------------------


@pytest.fixture
def sent(monkeypatch) -> list[int]:
    queued: list[int] = []
    monkeypatch.setattr(tasks.invoice_run_task, "delay", queued.append)
    monkeypatch.setattr(tasks.allocation_run_task, "delay", queued.append)
    return queued


def test_a_misspelt_field_on_an_invoice_run_is_a_400_and_starts_nothing(world, finance, sent):
    response = finance.post("/api/v1/invoice-runs", {"drafts": True}, format="json")

    assert response.status_code == 400
    field, message = _error(response)
    assert field == "drafts"
    assert message.startswith("drafts: unknown field") and "finalize" in message
    assert not InvoiceRun.objects.exists() and sent == []


def test_every_unknown_field_is_named_nested_ones_by_their_path(world, finance, sent):
    runs = finance.post(
        "/api/v1/costs/runs",
        {"start": "2026-11-01", "end": "2026-11-02", "scenaro": 1, "colour": "red"},
        format="json",
    )
    assert runs.status_code == 400
    details = runs.json()["error"]["details"]
    assert [d["field"] for d in details] == ["scenaro", "colour"]
    assert sent == []

    bulk = finance.post(
        "/api/v1/fx-rates/bulk",
        {"rates": [{"base": "EUR", "quote": "USD", "date": "2026-11-01", "rate": "1.1", "x": 1}]},
        format="json",
    )
    assert bulk.status_code == 400 and _error(bulk)[0] == "rates.0.x"
    assert not FxRate.objects.exists()


def test_a_query_string_may_carry_fields_a_write_may_not(world, finance):
    """Unknown query parameters are not writes (a cache-buster, a UI's own)."""
    response = finance.get(
        "/api/v1/costs/allocations",
        {"start": "2026-11-01", "end": "2026-11-02", "group_by": "tier", "_": "1"},
    )
    assert response.status_code == 200


def test_every_api_write_reads_its_body_through_validated():
    """validated (core.api_errors) is where unknown fields are refused: a
    view that builds its input serializer from the body itself skips it."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    apps = ["core", "tenants", "serving", "metering", "billing", "audit", "webhooks", "planning"]
    bypassing = [
        str(path.relative_to(root))
        for app in apps
        for path in (root / app).rglob("*.py")
        if "(data=request.data" in path.read_text()
    ]
    assert bypassing == []
