"""An invoice as accounts payable reads it, in every
copy: the page (finance staff and the tenant's member), the HTML download
(which is also what prints to PDF: the page's print is the same document,
only its action buttons hidden) and the Stripe invoice items. Quantities
grouped with their unit, unit prices with currency and what they are per,
each graduated tier named; two tenants in two currencies."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

import pytest
from django.test import Client

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import Invoice, ModelPrice, PriceBook, VolumeTier
from billing.payments.sync import invoice_stripe_sync
from metering.models import UsageRollup
from serving.models import Pool, ServedModel
from tests.billing.conftest import NOV, OCT
from tests.factories import make_finance_user, make_member, make_tenant

# The Alpha (USD) lines as every copy shows them: description, quantity, unit price, amount.
ALPHA = [
    ["tiny-llama: input tokens", "2,000,000 tokens", "0.20 USD / 1M tokens", "0.40 USD"],
    [
        "tiny-llama: output tokens, tier 1 (first 10M)",
        "10,000,000 tokens",
        "0.80 USD / 1M tokens",
        "8.00 USD",
    ],
    [
        "tiny-llama: output tokens, tier 2 (above 10M)",
        "1,553,065,625 tokens",
        "0.60 USD / 1M tokens",
        "931.84 USD",  # 931.839375 rounded once
    ],
    ["tiny-llama: GPU-seconds", "12,345.7 GPU-seconds", "0.0002 USD / GPU-second", "2.47 USD"],
]
# Euro Co (EUR, dedicated tier): its own book, one dedicated GPU all October.
EURO = [
    ["tiny-llama: output tokens", "3,000,000 tokens", "1.50 EUR / 1M tokens", "4.50 EUR"],
    ["Dedicated GPUs (GPU-months)", "1.000 GPU-months", "1,450.00 EUR / GPU-month", "1,450.00 EUR"],
]


def _book(name: str, *, tier: str, currency: str, model: ServedModel, **prices) -> ModelPrice:
    book = PriceBook.objects.create(
        name=name,
        tier=tier,
        currency=currency,
        effective_from=OCT,
        dedicated_per_gpu_month=prices.pop("dedicated", 0),
    )
    return ModelPrice.objects.create(
        book=book,
        served_model=model,
        **{"input_per_mtok": 0, "cached_input_per_mtok": 0, "output_per_mtok": 0} | prices,
    )


@pytest.fixture
def invoices(world) -> dict[str, Invoice]:
    """Alpha's and Euro Co's October invoices, finalized."""
    model = ServedModel.objects.create(name="tiny-llama")
    price = _book(
        "list",
        tier="",
        currency="USD",
        model=model,
        input_per_mtok=Decimal("0.20"),
        cached_input_per_mtok=Decimal("0.05"),
        output_per_mtok=Decimal("0.80"),
        per_gpu_second=Decimal("0.0002"),
    )
    for start, per_mtok in ((0, "0.80"), (10_000_000, "0.60")):
        VolumeTier.objects.create(
            model_price=price, kind="output", from_tokens=start, per_mtok=Decimal(per_mtok)
        )
    euro = make_tenant(name="Euro Co", tier="dedicated", billing_currency="EUR")
    _book(
        "euro dedicated",
        tier="dedicated",
        currency="EUR",
        model=model,
        output_per_mtok=Decimal("1.50"),
        dedicated=Decimal("1450"),
    )
    dedicated = world.pool("ded-euro", kind="dedicated", owner=euro)
    world.replica("ded-r", dedicated, [world.gpu("d1")])
    shared = Pool.objects.create(name="shared", kind="shared")
    for tenant, usage in (
        (
            world.a,
            {
                "prompt_tokens": 2_000_000,
                "completion_tokens": 1_563_065_625,
                "device_seconds": Decimal("12345.6789"),
            },
        ),
        (euro, {"completion_tokens": 3_000_000}),
    ):
        UsageRollup.objects.create(
            hour=OCT + timedelta(hours=5),
            tenant=tenant,
            served_model=model,
            pool=shared,
            requests_ok=1,
            **usage,
        )
    out = {}
    for tenant in (world.a, euro):
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        out[tenant.billing_currency] = invoice_finalize(invoice_id=draft.pk)
    return out


def _lines(html: str) -> list[list[str]]:
    """The invoice's lines as a person reads them (a line's book, shown
    under its description, left out)."""
    body = html.split('data-testid="invoice-lines"')[1].split("<tbody>")[1].split("</tbody>")[0]
    rows = [
        [
            unescape(re.sub(r"<[^>]+>", "", re.sub(r"<div.*?</div>", "", cell))).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for row in re.findall(r"<tr[^>]*>(.*?)</tr>", body, re.S)
    ]
    return [row for row in rows if len(row) == 4]


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_invoice_page_names_units_currencies_and_tiers(world, invoices):
    usd, eur = invoices["USD"], invoices["EUR"]
    finance = _client(make_finance_user())
    alpha = _client(make_member(world.a).user)
    euro = _client(make_member(eur.tenant).user)

    for client in (finance, alpha):
        html = client.get(f"/invoices/{usd.pk}/").content.decode()
        assert sorted(_lines(html)) == sorted(ALPHA)
        assert "1553065625" not in html and "12345.6789" not in html
    for client in (finance, euro):
        assert sorted(_lines(client.get(f"/invoices/{eur.pk}/").content.decode())) == sorted(EURO)
    assert alpha.get(f"/invoices/{eur.pk}/").status_code == 404  # nor the other way round
    assert euro.get(f"/invoices/{usd.pk}/").status_code == 404


def test_the_download_that_prints_to_pdf_reads_the_same(world, invoices):
    for invoice, expected in ((invoices["USD"], ALPHA), (invoices["EUR"], EURO)):
        member = _client(make_member(invoice.tenant).user)

        download = member.get(f"/invoices/{invoice.pk}/?download=1")

        assert download["Content-Disposition"] == f'attachment; filename="{invoice.number}.html"'
        html = download.content.decode()
        assert sorted(_lines(html)) == sorted(expected)
        # Printing hides only the action bar: the lines are the same on paper.
        assert "@media print { .actions { display: none; }" in html
        assert 'class="actions"' not in html  # the download has none


def test_stripe_items_say_quantity_unit_price_and_tier(world, invoices, stripe_fake):
    for invoice in invoices.values():
        assert invoice_stripe_sync(invoice_id=invoice.pk) == "synced"
        invoice.refresh_from_db()

    def described(invoice: Invoice) -> set[str]:
        return {
            item["description"]
            for item in stripe_fake.items.values()
            if item["invoice"] == invoice.stripe_invoice_id
        }

    assert described(invoices["USD"]) == {
        f"{description}: {quantity} at {unit_price}"
        for description, quantity, unit_price, _ in ALPHA
    }
    assert described(invoices["EUR"]) == {
        f"{description}: {quantity} at {unit_price}"
        for description, quantity, unit_price, _ in EURO
    }
    assert (
        "tiny-llama: output tokens, tier 2 (above 10M): 1,553,065,625 tokens "
        "at 0.60 USD / 1M tokens"
    ) in described(invoices["USD"])
