"""What an invoice document says, for a USD tenant and a JPY one (no minor
units): a plan's minimum commitment as money with its currency; no 0.00
discount line on an invoice without usage; the issuer's and the buyer's
countries; "Credited", not "Paid", once credit notes cover the total; and
the FOCUS export writes yen whole, as the invoice does."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.choices import InvoiceStatus
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize, invoice_transition
from billing.models import (
    Issuer,
    ModelPrice,
    Plan,
    PriceBook,
    Subscription,
    TaxProfile,
)
from tenants.models import Tenant
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_member


@pytest.fixture
def yen(world):
    """Alpha bills in USD, Bravo in JPY, each from a book in its currency."""
    Tenant.objects.filter(pk=world.b.pk).update(billing_currency="JPY")
    world.b.refresh_from_db()
    world.price(since=OCT - timedelta(days=31))
    book = PriceBook.objects.create(
        name="list-jpy", currency="JPY", effective_from=OCT - timedelta(days=31)
    )
    ModelPrice.objects.create(
        book=book,
        served_model=world.model,
        input_per_mtok=Decimal(150),
        cached_input_per_mtok=Decimal(40),
        output_per_mtok=Decimal(600),
    )
    return world


def _october(tenant):
    draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
    return invoice_finalize(invoice_id=draft.pk, now=NOV)


def _page(client, invoice) -> str:
    response = client.get(f"/invoices/{invoice.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_a_month_without_usage_bills_the_commitment_as_money_and_no_discount(
    client, yen, pinned_clock
):
    world = yen
    Issuer.objects.filter(is_default=True).update(country="IE", address="1 Dock Road\nDublin")
    TaxProfile.objects.create(tenant=world.a, country="US")
    for tenant, currency in ((world.a, "USD"), (world.b, "JPY")):
        plan = Plan.objects.create(
            name=f"growth-{currency}",
            currency=currency,
            minimum_commit=Decimal(500),
            discount_percent=Decimal(10),
        )
        Subscription.objects.create(tenant=tenant, plan=plan, start=OCT - timedelta(days=31))
    alpha, bravo = _october(world.a), _october(world.b)
    client.force_login(make_finance_user())

    html = _page(client, alpha)
    assert "growth-USD: minimum commitment 500.00 USD" in html
    assert "500.0000" not in html and "off usage" not in html and '">0.00 USD</td>' not in html
    assert 'data-testid="invoice-total">500.00 USD' in html
    assert 'data-testid="issuer-country">Country: IE<' in html
    assert 'data-testid="buyer-tax">Country: US<' in html
    html = _page(client, bravo)
    assert "growth-JPY: minimum commitment 500 JPY" in html
    assert "off usage" not in html and 'data-testid="invoice-total">500 JPY' in html
    assert 'data-testid="issuer-country">Country: IE<' in html

    pinned_clock.move_to(NOV + timedelta(days=10))
    response = client_for_user(make_finance_user()).get(
        "/api/v1/usage/focus", {"start": "2026-10-01", "end": "2026-11-01"}
    )
    assert response.status_code == 200
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    billed = {(r["BillingCurrency"], r["InvoiceId"]): r["BilledCost"] for r in rows}
    assert billed == {("USD", alpha.number): "500.00", ("JPY", bravo.number): "500"}
    yen_row = next(r for r in rows if r["BillingCurrency"] == "JPY")
    assert yen_row["ListCost"] == yen_row["EffectiveCost"] == "500"


def test_an_invoice_credited_in_full_reads_credited_not_paid(client, yen):
    world = yen
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=OCT + timedelta(hours=1), completion=1_000_000)
    alpha, bravo = _october(world.a), _october(world.b)  # 4.00 USD, 600 JPY
    assert (alpha.total_minor, bravo.total_minor) == (400, 600)
    credit_note_create(invoice_id=alpha.pk, amount_minor=100, reason="outage")
    credit_note_create(invoice_id=alpha.pk, amount_minor=300, reason="outage, the rest")
    credit_note_create(invoice_id=bravo.pk, amount_minor=600, reason="goodwill")

    for tenant, invoice in ((world.a, alpha), (world.b, bravo)):
        invoice.refresh_from_db()
        assert invoice.status == InvoiceStatus.PAID  # settled: nothing left to pay
        client.force_login(make_member(tenant).user)
        html = _page(client, invoice)
        assert 'data-testid="invoice-status">Credited<' in html
        assert 'data-testid="invoice-settled">Credited in full' in html
        listing = client.get("/invoices/").content.decode()
        row = listing.split(f"{invoice.number}</a>")[1].split("</tr>")[0]
        assert "Credited" in row and "Paid" not in row

    # Paid, then credited: it was paid (the note went back to the wallet).
    world.tokens(world.a, hour=NOV + timedelta(hours=1), completion=1_000_000)
    draft, _ = invoice_draft_build(
        tenant=world.a, period_start=NOV, period_end=NOV + timedelta(days=30)
    )
    paid = invoice_finalize(invoice_id=draft.pk, now=NOV + timedelta(days=30))
    invoice_transition(invoice_id=paid.pk, to=InvoiceStatus.PAID)
    credit_note_create(invoice_id=paid.pk, amount_minor=paid.total_minor, reason="refund")
    client.force_login(make_member(world.a).user)
    html = _page(client, paid)
    assert 'data-testid="invoice-status">Paid<' in html
    assert 'data-testid="invoice-settled">Paid' in html
