"""A tenant's monthly budget in the admin (issue 59 item 2): typed as a
plain decimal (core.plain_decimal) in the tenant's billing currency, on
the policy's page and on the tenant's (its inline), as the budget API
takes it: "1e2" or "1,50" is refused naming the field, 1.5 JPY too, and
nothing is written; "1,450" JPY is 1450."""

from __future__ import annotations

from decimal import Decimal as D
from html.parser import HTMLParser

import pytest

from tenants.models import TenantPolicy
from tests.factories import make_tenant


class _Form(HTMLParser):
    """The fields of an admin change page's form, as a browser submits it."""

    def __init__(self):
        super().__init__()
        self.data: dict[str, str] = {}
        self._select = self._textarea = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        name = attrs.get("name")
        if tag == "input" and name and attrs.get("type") not in ("submit", "button"):
            if attrs.get("type") != "checkbox" or "checked" in attrs:
                self.data[name] = attrs.get("value") or ("on" if attrs.get("type") == "checkbox"
                                                         else "")  # fmt: skip
        elif tag == "select" and name:
            self._select = name
            self.data.setdefault(name, "")
        elif tag == "option" and self._select and "selected" in attrs:
            self.data[self._select] = attrs.get("value") or ""
        elif tag == "textarea" and name:
            self._textarea = name
            self.data[name] = ""

    def handle_endtag(self, tag):
        if tag == "select":
            self._select = None
        elif tag == "textarea":
            self._textarea = None

    def handle_data(self, data):
        if self._textarea:
            self.data[self._textarea] += data.strip("\n")


def _change(client, path: str, **fields):
    """POST the change page at `path` as shown, with `fields` typed in."""
    form = _Form()
    form.feed(client.get(path).content.decode())
    data = {k: v for k, v in form.data.items() if k not in ("csrfmiddlewaretoken", "_addanother")}
    return client.post(path, data | fields)


def _save_budget(client, tenant, budget):
    policy = TenantPolicy.objects.get(tenant=tenant)
    path = f"/admin/tenants/tenantpolicy/{policy.pk}/change/"
    return _change(client, path, monthly_budget=budget)


@pytest.mark.parametrize(
    ("currency", "budget", "message"),
    [
        ("USD", "1e2", "without an exponent"),
        ("USD", "1,50", "is ambiguous: a comma only separates thousands"),
        ("USD", "100,00", "is ambiguous: a comma only separates thousands"),
        ("USD", "1" * 27, "too many digits"),
        ("USD", "10.005", "USD has 2 decimal places"),
        ("USD", "-5", "must not be negative"),
        ("JPY", "1.5", "JPY has 0 decimal places"),
    ],
)
def test_a_bad_budget_is_refused_naming_the_field(admin_client, currency, budget, message):
    tenant = make_tenant(name=f"Admin {currency}", billing_currency=currency)
    refused = _save_budget(admin_client, tenant, budget)
    assert refused.status_code == 200  # the form again, with its error
    page = refused.content.decode().replace("&#x27;", "'")
    assert "field-monthly_budget" in page and message in page
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget is None


@pytest.mark.parametrize(
    ("currency", "budget", "stored"),
    [("USD", "1,450.50", D("1450.50")), ("JPY", "1,450", D(1450))],
)
def test_a_plain_budget_is_saved(admin_client, currency, budget, stored):
    tenant = make_tenant(name=f"Admin {currency}", billing_currency=currency)
    done = _save_budget(admin_client, tenant, budget)
    assert done.status_code == 302, done.content.decode()[-3000:]
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget == stored


def test_the_tenants_page_checks_its_policys_budget_in_the_tenants_currency(admin_client):
    tenant = make_tenant(name="Inline JPY", billing_currency="JPY")
    path = f"/admin/tenants/tenant/{tenant.pk}/change/"
    refused = _change(admin_client, path, **{"policy-0-monthly_budget": "1.5"})
    assert refused.status_code == 200
    assert "JPY has 0 decimal places" in refused.content.decode()
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget is None
    done = _change(admin_client, path, **{"policy-0-monthly_budget": "1,450"})
    assert done.status_code == 302, done.content.decode()[-2000:]
    assert TenantPolicy.objects.get(tenant=tenant).monthly_budget == D(1450)
