"""The credit-note form on an invoice's page reads the amount with the
one parser (core.plain_decimal, issue 59 item 2): a comma only as a
thousands separator, never an exponent, the currency's minor units (JPY
has none); anything else is a 400 naming the field, and no credit note."""

from __future__ import annotations

import pytest

from billing.choices import InvoiceStatus
from billing.models import CreditNote, Invoice
from tests.billing.conftest import NOV, OCT
from tests.factories import make_finance_user, make_tenant

AMBIGUOUS = "is ambiguous: a comma only separates thousands"


@pytest.fixture
def yen_invoice(issued):
    """A finalized 5,000 JPY invoice of a tenant billed in yen."""
    tenant = make_tenant(name="Yamato", billing_currency="JPY")
    usd = issued["draft"]
    return Invoice.objects.create(
        tenant=tenant,
        issuer=usd.issuer,
        status=InvoiceStatus.FINALIZED,
        currency="JPY",
        period_start=OCT,
        period_end=NOV,
        sequence=9001,
        number="YEN-009001",
        subtotal_minor=5000,
        total_minor=5000,
        finalized_at=NOV,
        due_at=NOV,
    )


@pytest.fixture
def finance(client, db):
    client.force_login(make_finance_user())
    return client


def _credit(client, invoice, amount):
    return client.post(
        f"/invoices/{invoice.pk}/action",
        {"action": "credit_note", "amount": amount, "reason": "goodwill"},
    )


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        ("1,50", AMBIGUOUS),  # was 150.00 USD
        ("100,00", AMBIGUOUS),  # was 10,000.00 USD
        ("1e2", "without an exponent"),
        ("1e1", "without an exponent"),
        ("1e30", "without an exponent"),  # was a 500
        ("1" * 27, "too many digits: at most 16 before the decimal point"),  # was a 500
        ("-1.00", "must not be negative"),
    ],
)
def test_a_usd_credit_note_refuses_what_is_not_a_plain_amount(
    finance, world, issued, amount, message
):
    alpha = issued[world.a.slug]  # 4.00 USD
    response = _credit(finance, alpha, amount)
    assert response.status_code == 400, amount
    page = response.content.decode().replace("&#x27;", "'")
    assert "amount: " in page and message in page, amount
    assert not CreditNote.objects.exists()


def test_a_usd_credit_note_takes_a_plain_amount(finance, world, issued):
    alpha = issued[world.a.slug]
    assert _credit(finance, alpha, "1.50").status_code == 302
    assert CreditNote.objects.get(invoice=alpha).amount_minor == 150


def test_a_jpy_credit_note_has_no_minor_units(finance, yen_invoice):
    refused = _credit(finance, yen_invoice, "1.5")
    assert refused.status_code == 400
    assert "amount: JPY has 0 decimal places" in refused.content.decode()
    assert not CreditNote.objects.exists()

    assert _credit(finance, yen_invoice, "1,450").status_code == 302
    assert CreditNote.objects.get(invoice=yen_invoice).amount_minor == 1450  # 1,450 JPY
