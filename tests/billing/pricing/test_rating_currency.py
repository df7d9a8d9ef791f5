"""A tenant is rated in its billing currency (issue 59, item 1): from a book
in that currency where its tier has one, else from the book's prices
converted at the period's average dated rate, the line naming the rate; a
plan's commitment the same; no rate for the pair and a day: the draft
fails naming them, never 1:1."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest

from billing.errors import FxRateMissingError
from billing.invoicing.invoices import invoice_draft_build
from billing.models import FxRate, Plan, Subscription
from tests.billing.conftest import NOV, OCT
from tests.factories import make_tenant

D = Decimal


def _rates(base: str, quote: str, rate: str) -> None:
    day = date(2026, 9, 24)
    while day < NOV.date():
        FxRate.objects.create(base=base, quote=quote, date=day, rate=D(rate), source="test")
        day += timedelta(days=1)


def _lines(invoice):
    return [(line.kind, line.description, line.amount_minor) for line in invoice.lines.all()]


def test_a_euro_tenant_on_a_dollar_book_is_rated_at_the_dated_rate(world):
    """1,000,000 output tokens x 4 USD/M = 4 USD; USD/EUR 0.9 all October
    (stored as EUR/USD 1.25, inverted: 0.8): 3.20 EUR, the line saying so."""
    world.price()
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    _rates("EUR", "USD", "1.25")
    world.tokens(euro, hour=OCT + timedelta(hours=1), completion=1_000_000)

    draft, _ = invoice_draft_build(tenant=euro, period_start=OCT, period_end=NOV)

    assert draft.currency == "EUR" and draft.subtotal_minor == 320
    [(kind, description, minor)] = _lines(draft)
    assert (kind, minor) == ("tokens", 320)
    assert "(USD prices at 0.8 USD/EUR)" in description


def test_a_book_in_the_tenants_currency_is_preferred_and_not_converted(world):
    world.price()
    world.price(currency="EUR", output_per_mtok=D("3"))
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    world.tokens(euro, hour=OCT + timedelta(hours=1), completion=1_000_000)
    world.tokens(world.a, hour=OCT + timedelta(hours=1), completion=1_000_000)

    eur, _ = invoice_draft_build(tenant=euro, period_start=OCT, period_end=NOV)
    usd, _ = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)

    assert (eur.currency, eur.subtotal_minor) == ("EUR", 300)  # no rate needed
    assert (usd.currency, usd.subtotal_minor) == ("USD", 400)
    assert "prices at" not in _lines(eur)[0][1]


def test_a_yen_tenant_on_a_dollar_plan_owes_its_commitment_in_yen(world):
    """A 500.00 USD minimum commitment at USD/JPY 150 is 75,000 JPY, not 500
    JPY; its 1.05 billion output tokens at 4 USD/M are 4,200 USD = 630,000 JPY."""
    world.price()
    yen = make_tenant(name="Yen KK", billing_currency="JPY")
    _rates("USD", "JPY", "150")
    plan = Plan.objects.create(name="commit", currency="USD", minimum_commit=D("500"))
    Subscription.objects.create(tenant=yen, plan=plan, start=OCT - timedelta(days=31))
    world.tokens(yen, hour=OCT + timedelta(hours=1), completion=100_000)  # 0.40 USD = 60 JPY

    draft, _ = invoice_draft_build(tenant=yen, period_start=OCT, period_end=NOV)

    assert draft.currency == "JPY" and draft.subtotal_minor == 75_000
    true_up = next(line for line in draft.lines.all() if line.kind == "commit_true_up")
    assert true_up.amount_minor == 74_940
    assert "minimum commitment 75,000 JPY (500.00 USD at 150 USD/JPY)" in true_up.description

    world.tokens(yen, hour=OCT + timedelta(hours=2), completion=1_050_000_000)
    again, _ = invoice_draft_build(tenant=yen, period_start=OCT, period_end=NOV)
    assert again.subtotal_minor == 60 + 630_000


def test_no_rate_for_the_pair_fails_the_draft_naming_it_never_one_to_one(world):
    world.price()
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    world.tokens(euro, hour=OCT + timedelta(hours=1), completion=1_000_000)

    with pytest.raises(FxRateMissingError, match="no USD/EUR exchange rate for 2026-10-01"):
        invoice_draft_build(tenant=euro, period_start=OCT, period_end=NOV)
    assert not euro.invoices.exists()
