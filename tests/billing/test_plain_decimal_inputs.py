"""Every way a typed number comes in reads it with the one parser
(core.plain_decimal, issue 59 item 2): the tax rate's percent (API, page,
admin), an SLA credit's percent (API, invoice page), a budget (API, in a
USD and a JPY tenant), an FX rate, a cost rate and a credit grant. An
exponent, an ambiguous comma, too many digits, more places than the
currency has or a minus where none belongs is a 400 naming the field,
and nothing is written."""

from __future__ import annotations

from decimal import Decimal as D

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import CostRate, CreditGrant, FxRate, SlaCreditAdjustment, TaxRate
from tenants.models import TenantPolicy
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

AMBIGUOUS = "is ambiguous: a comma only separates thousands"
EXPONENT = "without an exponent"
NEGATIVE = "must not be negative"
REFUSED = [
    ("1e1", EXPONENT),
    ("1e2", EXPONENT),
    ("8,1", AMBIGUOUS),
    ("-1", NEGATIVE),
]


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


def _error(response) -> tuple[str, str]:
    error = response.json()["error"]
    (detail,) = error["details"] if error.get("details") else [error]
    return detail["field"], detail["message"]


# -- tax percent ----------------------------------------------------------------

RATE = {"country": "FR", "name": "VAT", "valid_from": "2026-01-01"}


@pytest.mark.parametrize(("percent", "message"), REFUSED)
def test_a_tax_percent_is_a_plain_decimal_in_the_api_the_page_and_the_admin(
    finance, percent, message
):
    refused = finance.post("/api/v1/tax/rates", {**RATE, "percent": percent}, format="json")
    assert refused.status_code == 400
    field, text = _error(refused)
    assert field == "percent" and message in text

    page = finance.post("/finance/tax/", {**RATE, "action": "rate", "percent": percent})
    assert page.status_code == 400
    assert "percent: " in page.content.decode() and message in page.content.decode()

    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "r@example.test", "pw"))
    refused = admin.post("/admin/billing/taxrate/add/", {**RATE, "percent": percent})
    assert refused.status_code == 200 and message in refused.content.decode()
    assert not TaxRate.objects.exists()


def test_a_plain_tax_percent_is_taken(finance):
    done = finance.post("/api/v1/tax/rates", {**RATE, "percent": "8.1"}, format="json")
    assert done.status_code == 201, done.content
    assert TaxRate.objects.get().percent == D("8.1")


# -- SLA credit percent -----------------------------------------------------------


@pytest.mark.parametrize(("percent", "message"), REFUSED)
def test_an_sla_credit_percent_is_a_plain_decimal_in_the_api_and_the_page(
    finance, issued, percent, message
):
    draft = issued["draft"]
    body = {"metric": "availability", "action": "adjust", "reason": "x", "credit_percent": percent}
    refused = finance.post(f"/api/v1/invoices/{draft.pk}/sla-credits", body, format="json")
    assert refused.status_code == 400
    field, text = _error(refused)
    assert field == "credit_percent" and message in text

    page = finance.post(f"/invoices/{draft.pk}/sla-credit", body)
    assert page.status_code == 400
    html = page.content.decode()
    assert "credit_percent: " in html and message in html
    assert not SlaCreditAdjustment.objects.exists()


# -- budgets ----------------------------------------------------------------------


def _budget(finance, tenant, value):
    return finance.put(
        f"/api/v1/tenants/{tenant.slug}/budget", {"monthly_budget": value}, format="json"
    )


@pytest.mark.parametrize(
    ("currency", "value", "message"),
    [
        ("USD", "1e2", EXPONENT),
        ("USD", "1,50", AMBIGUOUS),
        ("USD", "100,00", AMBIGUOUS),
        ("USD", "1" * 27, "too many digits"),
        ("USD", "12.345", "USD has 2 decimal places"),
        ("USD", "-5", NEGATIVE),
        ("JPY", "1.5", "JPY has 0 decimal places"),
        ("JPY", "1e3", EXPONENT),
    ],
)
def test_a_budget_is_a_plain_amount_in_the_tenants_currency(finance, currency, value, message):
    tenant = make_tenant(name=f"Budget {currency}", billing_currency=currency)
    refused = _budget(finance, tenant, value)
    assert refused.status_code == 400, refused.content
    field, text = _error(refused)
    assert field == "monthly_budget" and message in text
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget is None


@pytest.mark.parametrize(("currency", "value", "stored"), [("USD", "1,450.50", D("1450.50")),
                                                           ("JPY", "1,450", D(1450))])  # fmt: skip
def test_a_budget_with_thousands_separators_is_taken(finance, currency, value, stored):
    tenant = make_tenant(name=f"Budget {currency}", billing_currency=currency)
    assert _budget(finance, tenant, value).status_code == 200
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget == stored


# -- FX rates, cost rates, credit grants ---------------------------------------------


def test_an_fx_rate_cost_rate_and_credit_grant_refuse_an_exponent(finance):
    fx = {"base": "EUR", "quote": "USD", "date": "2026-11-02", "rate": "1e1"}
    refused = finance.post("/api/v1/fx-rates", fx, format="json")
    assert refused.status_code == 400 and _error(refused)[0] == "rate"
    assert EXPONENT in _error(refused)[1]

    cost = {"component": "energy", "basis": "per_kwh", "amount": "1e-1",
            "effective_from": "2026-11-01"}  # fmt: skip
    refused = finance.post("/api/v1/costs/rates", cost, format="json")
    assert refused.status_code == 400 and _error(refused)[0] == "amount"
    assert EXPONENT in _error(refused)[1]

    tenant = make_tenant(name="Prepaid")
    grant = {"tenant": tenant.slug, "amount": "1e2"}
    refused = finance.post("/api/v1/credit-grants", grant, format="json")
    assert refused.status_code == 400 and _error(refused)[0] == "amount"
    assert EXPONENT in _error(refused)[1]
    assert not (FxRate.objects.exists() or CostRate.objects.exists())
    assert not CreditGrant.objects.exists()
