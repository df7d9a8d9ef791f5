"""Tax on invoices, worked by hand, the way finance uses it: rates and
tenants' tax profiles entered through the API, October invoiced by an
invoice run, a credit note through the API; the invoice page, FOCUS and
Stripe (the real SDK against the fake server) all carry the same tax.

The issuer is in Ireland. Rates: France's VAT 20% (21% from 1 November),
Australia's GST 10%. Three tenants:

- Alpha (USD), a consumer in France: 1,234,567 input tokens at $1/M ->
  1.23, 2,345,678 output at $4/M -> 9.38. Tax per line: 0.246 -> 0.25 and
  1.876 -> 1.88, 2.13 (on the subtotal, 10.61 x 20% would be 2.12: each
  line is rounded, as Stripe does); total 12.74.
- Bravo (EUR), a business in Germany with a VAT id: reverse charge, no
  tax; the invoice says so and names both VAT ids.
- Koala (USD), in Australia: 450,000 input -> 0.45, 11,250,000 output ->
  45.00. GST 0.045 -> 0.05 (half away from zero) and 4.50; total 50.00."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, transaction
from django.db.utils import IntegrityError

from billing import tasks
from billing.choices import StripeSync
from billing.models import Invoice, Issuer, TaxProfile, TaxRate
from billing.payments.sync import invoice_stripe_sync
from tests.billing.conftest import OCT
from tests.billing.reports.test_focus_export import FOCUS, RANGE, export
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_member, make_tenant
from tests.focus import focus_problems
from tests.focus_validator import focus_validate

RATES = "/api/v1/tax/rates"


def profile_url(tenant) -> str:
    return f"/api/v1/tenants/{tenant.slug}/tax-profile"


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


@pytest.fixture
def taxed(world, finance, monkeypatch):
    """October invoiced by a run for Alpha, Bravo and Koala, taxed."""
    Issuer.objects.filter(is_default=True).update(country="IE", tax_id="IE6388047V")
    for rate in (
        {"country": "FR", "name": "VAT", "percent": "20", "valid_from": "2020-01-01"},
        {"country": "FR", "name": "VAT", "percent": "21", "valid_from": "2026-11-01"},
        {"country": "AU", "name": "GST", "percent": "10", "valid_from": "2000-07-01"},
    ):
        assert finance.post(RATES, rate, format="json").status_code == 201
    world.b.billing_currency = "EUR"
    world.b.save(update_fields=["billing_currency"])
    koala = make_tenant(name="Koala")
    for tenant, profile in (
        (world.a, {"country": "fr"}),
        (world.b, {"country": "DE", "tax_id": "DE 123 456 789"}),
        (koala, {"country": "AU", "tax_id": "51 824 753 556"}),
    ):
        answer = finance.put(profile_url(tenant), profile, format="json")
        assert answer.status_code == 200, answer.json()
    world.price()
    world.price(currency="EUR")  # Bravo's book
    hour = OCT + timedelta(days=3)
    world.tokens(world.a, hour=hour, prompt=1_234_567, completion=2_345_678)
    world.tokens(world.b, hour=hour, prompt=1_000_000, completion=1_000_000)
    world.tokens(koala, hour=hour, prompt=450_000, completion=11_250_000)
    monkeypatch.setattr(tasks.invoice_run_task, "delay", lambda run_id: None)
    run = finance.post(
        "/api/v1/invoice-runs", {"as_of": "2026-11-02T00:00:00Z"}, format="json"
    ).json()
    tasks.invoice_run_task(run["id"])
    return {
        t.slug: Invoice.objects.get(tenant=t, period_start=OCT) for t in (world.a, world.b, koala)
    }, koala


def test_two_jurisdictions_and_a_reverse_charge_come_out_as_worked_by_hand(world, finance, taxed):
    invoices, koala = taxed
    alpha = finance.get(f"/api/v1/invoices/{invoices[world.a.slug].pk}").json()
    assert [(line["amount_minor"], line["tax_minor"]) for line in alpha["lines"]] == [
        (123, 25),
        (938, 188),
    ]
    assert all(Decimal(line["tax_percent"]) == 20 for line in alpha["lines"])
    assert (alpha["subtotal_minor"], alpha["tax_minor"], alpha["total_minor"]) == (1061, 213, 1274)
    assert (alpha["tax_treatment"], alpha["buyer_country"], alpha["tax_note"]) == (
        "standard",
        "FR",
        "",
    )

    bravo = finance.get(f"/api/v1/invoices/{invoices[world.b.slug].pk}").json()
    assert bravo["currency"] == "EUR"
    assert (bravo["subtotal_minor"], bravo["tax_minor"], bravo["total_minor"]) == (500, 0, 500)
    assert bravo["tax_treatment"] == "reverse_charge" and bravo["buyer_tax_id"] == "DE123456789"
    assert bravo["tax_note"].startswith("Reverse charge: VAT to be accounted for by the recipient")
    assert "DE123456789" in bravo["tax_note"] and "IE6388047V" in bravo["tax_note"]
    assert all(line["tax_minor"] == 0 and line["tax_percent"] is None for line in bravo["lines"])

    gst = finance.get(f"/api/v1/invoices/{invoices[koala.slug].pk}").json()
    assert [(line["amount_minor"], line["tax_minor"]) for line in gst["lines"]] == [
        (45, 5),
        (4500, 450),
    ]
    assert (gst["subtotal_minor"], gst["tax_minor"], gst["total_minor"]) == (4545, 455, 5000)

    # A rate or a profile changed later changes no issued invoice.
    finance.put(profile_url(world.a), {"country": "AU"}, format="json")
    assert Invoice.objects.get(pk=invoices[world.a.slug].pk).tax_minor == 213


def test_a_credit_note_reverses_its_share_of_the_tax_and_focus_carries_it(
    world, finance, taxed, monkeypatch
):
    invoices, _ = taxed
    invoice = invoices[world.a.slug]
    url = f"/api/v1/invoices/{invoice.pk}/credit-notes"
    first = finance.post(url, {"amount_minor": 637, "reason": "half"}, format="json").json()
    second = finance.post(url, {"amount_minor": 637, "reason": "the rest"}, format="json").json()
    assert (first["tax_minor"], second["tax_minor"]) == (107, 106)  # 1.065 -> 1.07; the rest
    invoice.refresh_from_db()
    assert invoice.status == "paid"  # credited in full

    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: OCT + timedelta(days=40))
    rows = export(finance, tenant=world.a.slug)
    billed = rows.groupby("InvoiceId")["BilledCost"].apply(lambda c: sum(Decimal(v) for v in c))
    assert billed[invoice.number] == Decimal("12.74")
    assert billed[first["number"]] == Decimal("-6.37")
    tax = rows[rows["ChargeCategory"] == "Tax"]
    assert sorted((r.InvoiceId, Decimal(r.BilledCost)) for r in tax.itertuples()) == sorted(
        [
            (invoice.number, Decimal("2.13")),
            (first["number"], Decimal("-1.07")),
            (second["number"], Decimal("-1.06")),
        ]
    )
    assert set(tax["ChargeDescription"]) >= {"VAT 20% (FR) on usage"}
    assert focus_problems(rows) == []  # FOCUS 1.2's column rules hold on the tax rows


def test_the_finops_foundations_validator_accepts_tax_rows_and_their_reversal(
    world, finance, taxed, validator, tmp_path, monkeypatch
):
    invoices, _ = taxed
    invoice = invoices[world.a.slug]
    url = f"/api/v1/invoices/{invoice.pk}/credit-notes"
    assert (
        finance.post(url, {"amount_minor": 637, "reason": "half"}, format="json").status_code == 201
    )
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: OCT + timedelta(days=40))
    response = finance.get(FOCUS, {**RANGE, "dataset": "billing", "format": "csv"})
    assert response.status_code == 200
    data = tmp_path / "billing.csv"
    data.write_bytes(b"".join(response.streaming_content))
    assert b",Tax," in data.read_bytes()
    validation = focus_validate(validator, data, data_format="csv")
    assert not validation.failed, "\n".join(validation.failed)
    assert validation.passed >= 100, validation.report[-3000:]  # it did check


def test_stripe_computes_the_same_tax_from_the_rate_on_each_line(world, taxed, stripe_fake):
    invoices, koala = taxed
    for slug in (world.a.slug, koala.slug):
        Invoice.objects.filter(pk=invoices[slug].pk).update(stripe_sync=StripeSync.PENDING)
        assert invoice_stripe_sync(invoice_id=invoices[slug].pk) == StripeSync.SYNCED
    totals = {i["metadata"]["ledger_number"]: i["total"] for i in stripe_fake.invoices.values()}
    assert totals == {invoices[world.a.slug].number: 1274, invoices[koala.slug].number: 5000}
    assert {r["display_name"]: r["percentage"] for r in stripe_fake.tax_rates.values()} == {
        "VAT": 20.0,
        "GST": 10.0,
    }
    assert all(len(item["tax_rates"]) == 1 for item in stripe_fake.items.values())
    # The reverse-charged invoice goes with its wording and no rate.
    bravo = invoices[world.b.slug]
    Invoice.objects.filter(pk=bravo.pk).update(stripe_sync=StripeSync.PENDING)
    invoice_stripe_sync(invoice_id=bravo.pk)
    bravo.refresh_from_db()
    assert stripe_fake.invoices[bravo.stripe_invoice_id]["footer"].startswith("Reverse charge")
    assert stripe_fake.invoices[bravo.stripe_invoice_id]["total"] == 500


def test_a_credit_note_goes_to_stripe_with_its_share_of_the_tax(world, finance, taxed, stripe_fake):
    """Stripe's credit notes split as ours: the net on a line, the tax
    reversed at the invoice's rate, adding up to the note to the cent."""
    invoices, _ = taxed
    invoice = invoices[world.a.slug]
    Invoice.objects.filter(pk=invoice.pk).update(stripe_sync=StripeSync.PENDING)
    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.SYNCED
    url = f"/api/v1/invoices/{invoice.pk}/credit-notes"
    for amount, reason in ((637, "half"), (637, "the rest")):
        made = finance.post(url, {"amount_minor": amount, "reason": reason}, format="json")
        assert made.status_code == 201, made.content
    invoice_stripe_sync(invoice_id=invoice.pk)

    [vat] = stripe_fake.tax_rates
    notes = sorted(stripe_fake.credit_notes.values(), key=lambda n: n["id"])
    assert [(n["total"], n["subtotal"], n["tax_amounts"]) for n in notes] == [
        (637, 530, [{"amount": 107, "tax_rate": vat}]),
        (637, 531, [{"amount": 106, "tax_rate": vat}]),
    ]
    invoice.refresh_from_db()
    stripe_invoice = stripe_fake.invoices[invoice.stripe_invoice_id]
    assert sum(n["total"] for n in notes) == stripe_invoice["total"] == invoice.total_minor
    # Credited in full before payment: nothing left due, paid there as here
    # (the notes went first; Stripe refuses a note with no home on a paid one).
    assert (stripe_invoice["status"], stripe_invoice["amount_remaining"]) == ("paid", 0)
    assert (invoice.status, invoice.stripe_status, invoice.stripe_sync) == (
        "paid",
        "paid",
        StripeSync.SYNCED,
    )


def test_a_stripe_total_other_than_ours_is_never_issued_there(
    world, taxed, stripe_fake, monkeypatch
):
    """Were Stripe to round 0.045 half to even (0.04), its total would be
    49.99: the invoice stays a draft in Stripe and the sync says why."""
    from decimal import ROUND_HALF_EVEN

    import tests.stripe_fake as fake_module

    monkeypatch.setattr(
        fake_module,
        "_tax",
        lambda amount, pct: int(
            (Decimal(amount) * Decimal(str(pct)) / 100).quantize(1, ROUND_HALF_EVEN)
        ),
    )
    invoices, koala = taxed
    invoice = invoices[koala.slug]
    Invoice.objects.filter(pk=invoice.pk).update(stripe_sync=StripeSync.PENDING)
    with pytest.raises(Exception, match=r"Stripe's total for .* is 4999, ours 5000"):
        invoice_stripe_sync(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_sync == StripeSync.FAILED and "4999" in invoice.stripe_error
    assert stripe_fake.invoices[invoice.stripe_invoice_id]["status"] == "draft"


def test_the_invoice_page_shows_subtotal_tax_and_the_wording(world, taxed):
    invoices, _ = taxed
    alpha = client_for_user(make_member(world.a).user)
    page = alpha.get(f"/invoices/{invoices[world.a.slug].pk}/").content.decode()
    assert 'data-testid="invoice-subtotal">10.61 USD' in page
    assert 'VAT 20% (FR) on 10.61 USD</td><td class="num">2.13 USD' in page
    assert 'data-testid="invoice-total">12.74 USD' in page
    bravo = client_for_user(make_member(world.b).user)
    page = bravo.get(f"/invoices/{invoices[world.b.slug].pk}/").content.decode()
    assert "Tax (reverse charge)" in page and "DE · VAT/tax ID DE123456789" in page
    assert 'data-testid="tax-note">Reverse charge: VAT to be accounted for' in page
    # Each reads only its own profile.
    from tests.conftest import client_for_key
    from tests.factories import make_key

    _, secret = make_key(world.a, scopes=["billing:read"])
    own = client_for_key(secret)
    assert own.get(profile_url(world.a)).json()["country"] == "FR"
    assert own.get(profile_url(world.b)).status_code == 404
    assert own.put(profile_url(world.a), {"country": "US"}, format="json").status_code == 403


def test_the_database_refuses_to_change_an_issued_invoices_tax(world, taxed, finance):
    invoices, _ = taxed
    invoice = invoices[world.a.slug]
    note = finance.post(
        f"/api/v1/invoices/{invoice.pk}/credit-notes",
        {"amount_minor": 100, "reason": "x"},
        format="json",
    ).json()
    for sql, pk in (
        ("UPDATE billing_invoice SET tax_minor = 0 WHERE id = %s", invoice.pk),
        ("UPDATE billing_invoice SET tax_note = 'x' WHERE id = %s", invoice.pk),
        ("UPDATE billing_invoiceline SET tax_minor = 0 WHERE invoice_id = %s", invoice.pk),
        ("UPDATE billing_creditnote SET tax_minor = 0 WHERE id = %s", note["id"]),
    ):
        with (
            pytest.raises(IntegrityError, match="cannot be changed"),
            transaction.atomic(),
            connection.cursor() as cursor,
        ):
            cursor.execute(sql, [pk])
    # The rate an issued invoice used cannot be deleted.
    from django.db.models import ProtectedError

    with pytest.raises(ProtectedError):
        TaxRate.objects.get(country="FR", percent=20).delete()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"country": "XX"}, "country"),
        ({"country": "FR", "tax_id": "DE123456789"}, "tax_id"),
        ({"country": "GR", "tax_id": "GR123456789"}, "tax_id"),
        ({"country": "FR", "exempt": True}, "exempt_reason"),
        ({}, "country"),
    ],
)
def test_a_bad_tax_profile_is_a_400_naming_the_field_with_nothing_written(
    world, finance, body, field
):
    answer = finance.put(profile_url(world.a), body, format="json")
    assert answer.status_code == 400 and answer.json()["error"]["field"] == field, answer.json()
    assert not TaxProfile.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"country": "France", "name": "VAT", "percent": "20", "valid_from": "2026-01-01"},
            "country",
        ),
        ({"country": "FR", "name": "", "percent": "20", "valid_from": "2026-01-01"}, "name"),
        ({"country": "FR", "name": "VAT", "percent": "120", "valid_from": "2026-01-01"}, "percent"),
        (
            {"country": "FR", "name": "VAT", "percent": "2.00001", "valid_from": "2026-01-01"},
            "percent",
        ),
        ({"country": "FR", "name": "VAT", "percent": "x", "valid_from": "2026-01-01"}, "percent"),
        ({"country": "FR", "name": "VAT", "percent": "20", "valid_from": "January"}, "valid_from"),
    ],
)
def test_a_bad_rate_is_a_400_naming_the_field_with_nothing_written(finance, body, field):
    answer = finance.post(RATES, body, format="json")
    assert answer.status_code == 400 and answer.json()["error"]["field"] == field, answer.json()
    assert not TaxRate.objects.exists()


def test_two_rates_of_one_country_from_one_day_are_refused_and_tenants_cannot_set_rates(
    world, finance
):
    rate = {"country": "FR", "name": "VAT", "percent": "20", "valid_from": "2026-01-01"}
    assert finance.post(RATES, rate, format="json").status_code == 201
    again = finance.post(RATES, {**rate, "percent": "19"}, format="json")
    assert again.status_code == 400 and again.json()["error"]["field"] == "valid_from"
    assert "FR already has a rate from 2026-01-01" in again.json()["error"]["message"]
    assert TaxRate.objects.count() == 1
    none = finance.get(profile_url(world.a))
    assert none.status_code == 404 and "has no tax profile" in none.json()["error"]["message"]
    owner = client_for_user(make_member(world.a).user)
    assert owner.post(RATES, {**rate, "valid_from": "2026-02-01"}, format="json").status_code == 403


def test_the_tax_page_adds_rates_and_profiles_and_refuses_bad_ones_by_field(world):
    page = client_for_user(make_finance_user())
    bad = page.post("/finance/tax/", {"action": "profile", "tenant": world.a.slug, "country": "ZZ"})
    assert bad.status_code == 400 and b"country: &#x27;ZZ&#x27; is not an ISO 3166-1" in bad.content
    assert not TaxProfile.objects.exists()
    bad = page.post(
        "/finance/tax/",
        {
            "action": "rate",
            "country": "FR",
            "name": "VAT",
            "percent": "-1",
            "valid_from": "2026-01-01",
        },
    )
    assert bad.status_code == 400 and b"percent: must not be negative" in bad.content
    done = page.post(
        "/finance/tax/",
        {
            "action": "rate",
            "country": "FR",
            "name": "VAT",
            "percent": "20",
            "valid_from": "2026-01-01",
        },
    )
    assert done.status_code == 302
    page.post(
        "/finance/tax/",
        {
            "action": "profile",
            "tenant": world.a.slug,
            "country": "FR",
            "exempt": "on",
            "exempt_reason": "charity",
        },
    )
    listed = page.get("/finance/tax/").content.decode()
    assert "VAT" in listed and "yes: charity" in listed
    assert client_for_user(make_member(world.a).user).get("/finance/tax/").status_code == 403
