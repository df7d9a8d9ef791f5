"""The request trace's money (issue 40 item 8): the request's own charge
priced part by part in the tenant's billing currency, only the invoice
lines it fed (not the period's other models and kinds), and for finance
staff its part of the hour's GPU cost with its currency. A second tenant
billed in EUR sees its own request in EUR and not the first's (404)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import ModelPrice, PriceBook, VolumeTier
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from serving.models import Gpu
from serving.services import local_gpu_ensure, replica_register, served_model_ensure
from serving.tiny_model import model_config
from tenants.models import Tenant
from tests.factories import make_finance_user, make_member
from tests.ledger import T0

OCT, NOV = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)
TOKENS = {"prompt_tokens": 1000, "cached_tokens": 0, "completion_tokens": 250}


@pytest.fixture
def billed(ledger):
    """Alpha (USD) sends a1 (1,000 prompt, 250 completion) beside Bravo's b1
    (EUR, the same tokens, so the window's device-seconds split evenly), a2
    two hours later with cached tokens, and a3 on another model: Alpha's
    October invoice then has cached-input lines and another model's lines
    that a1 did not feed."""
    Tenant.objects.filter(pk=ledger.b.pk).update(billing_currency="EUR")
    ledger.b.refresh_from_db()
    other = served_model_ensure(name="tiny-other", config=model_config())
    other_replica = replica_register(
        name="r3",
        base_url="http://127.0.0.1:9003",
        model=other,
        pool=ledger.pool,
        gpus=[local_gpu_ensure(serial="gpu-r3")],
    )
    Gpu.objects.update(in_service_date=OCT.date())
    book = PriceBook.objects.create(name="list", effective_from=OCT - timedelta(days=31))
    price = ModelPrice.objects.create(
        book=book,
        served_model=ledger.model,
        input_per_mtok=Decimal("1.5"),
        cached_input_per_mtok=Decimal("0.5"),
        output_per_mtok=Decimal("6"),
        per_gpu_second=Decimal("0.002"),
    )
    ModelPrice.objects.create(
        book=book,
        served_model=other,
        input_per_mtok=Decimal("3"),
        cached_input_per_mtok=Decimal("1"),
        output_per_mtok=Decimal("9"),
    )
    # Bravo's book: the same figures in euros (a tenant is rated in its own currency).
    euro = PriceBook.objects.create(
        name="list-eur", currency="EUR", effective_from=book.effective_from
    )
    for each in ModelPrice.objects.filter(book=book):
        each.pk, each.book = None, euro
        each.save()
    usage_record_batch(
        events=[
            ledger.event("a1", **TOKENS),
            ledger.event("b1", tenant=ledger.b, **TOKENS),
            ledger.event(
                "a2",
                at=T0 + timedelta(hours=2),
                prompt_tokens=500,
                cached_tokens=200,
                completion_tokens=100,
            ),
            ledger.event("a3", model=other.name, replica_id=other_replica.pk),
        ],
        source=EventSource.API,
    )
    metering_run(now=T0 + timedelta(hours=4))
    hour = T0.replace(minute=0)
    allocation_run_execute(
        run_id=allocation_run_create(start=hour, end=hour + timedelta(hours=1)).pk
    )
    invoices = {}
    for tenant in (ledger.a, ledger.b):
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        invoices[tenant.pk] = invoice_finalize(invoice_id=draft.pk)
    return price, invoices


def test_a_member_sees_its_requests_own_charge_priced_part_by_part(client, ledger, billed):
    """a1 on the flat card, in USD (Alpha's billing currency):
    input 1,000 x 1.5 / 1M = 0.0015; output 250 x 6 / 1M = 0.0015;
    no cached tokens, so no cached part; GPU-seconds: the one-second window
    on r1's one GPU less its 0.1 s queue = 0.9 device-seconds, split evenly
    with b1 (same tokens) = 0.45, x 0.002 = 0.0009. Total 0.0039 USD.
    The invoice lines it fed: its model's input, output and GPU-seconds
    lines; not its model's cached-input line (a2's) nor tiny-other's (a3's)."""
    _, invoices = billed
    client.force_login(make_member(ledger.a).user)

    page = client.get("/requests/a1/")

    assert page.status_code == 200
    charge = page.context["charge"]
    assert charge.currency == "USD" and not charge.graduated
    assert [(p.kind, p.quantity, p.unit_price, p.amount) for p in charge.parts] == [
        ("input", Decimal(1000), Decimal("1.5"), Decimal("0.0015")),
        ("output", Decimal(250), Decimal("6"), Decimal("0.0015")),
        ("gpu_seconds", Decimal("0.45"), Decimal("0.002"), Decimal("0.0009")),
    ]
    assert charge.total == Decimal("0.0039")
    html = page.content.decode()
    assert 'data-testid="trace-charge-total">0.0039 USD<' in html
    assert "1.50 USD per million tokens" in html and "0.002 USD per GPU-second" in html
    assert "apportionment" not in html  # a flat card prices one request exactly

    invoice = invoices[ledger.a.pk]
    assert page.context["invoice"] == invoice
    fed = page.context["lines"]
    assert {(line.model, line.kind, line.token_kind) for line in fed} == {
        (ledger.model.name, "tokens", "input"),
        (ledger.model.name, "tokens", "output"),
        (ledger.model.name, "gpu_seconds", ""),
    }
    on_invoice = {(line.model, line.kind, line.token_kind) for line in invoice.lines.all()}
    assert (ledger.model.name, "tokens", "cached_input") in on_invoice
    assert ("tiny-other", "tokens", "input") in on_invoice
    assert html.count('data-testid="trace-line"') == 3
    assert "tiny-other" not in html and "cached input tokens" not in html.lower()
    assert all(f"{line.amount_minor / 100:.2f} USD" in html for line in fed)
    assert "trace-cost" not in html  # cost is finance's

    assert client.get("/requests/b1/").status_code == 404


def test_a_tenant_billed_in_euros_sees_its_charge_in_euros(client, ledger, billed):
    """b1: the same tokens and book as a1, in Bravo's currency: 0.0039 EUR."""
    client.force_login(make_member(ledger.b).user)

    page = client.get("/requests/b1/")

    assert page.status_code == 200
    assert page.context["charge"].currency == "EUR"
    assert page.context["charge"].total == Decimal("0.0039")
    html = page.content.decode()
    assert 'data-testid="trace-charge-total">0.0039 EUR<' in html
    assert "1.50 EUR per million tokens" in html and " USD" not in html
    assert page.context["invoice"].currency == "EUR"
    assert client.get("/requests/a1/").status_code == 404


def test_finance_sees_its_part_of_the_hours_gpu_cost_with_its_currency(client, ledger, billed):
    """a1 is Alpha's only request on its model in pool shared at 12:00, so
    its 0.45 device-seconds of Alpha's 0.45 there carry all of the
    allocated cost of that row, in the pool-hour's currency (USD)."""
    client.force_login(make_finance_user())

    page = client.get("/requests/a1/")

    assert page.status_code == 200
    cost = page.context["cost"]
    (hour,) = cost.hours
    assert hour.device_seconds == hour.seconds == Decimal("0.45")
    assert hour.allocated > 0 and cost.share == hour.allocated.quantize(Decimal("1e-9"))
    assert cost.currency == "USD"
    html = page.content.decode()
    assert f'data-testid="trace-cost-share">{cost.share.normalize():f} USD<' in html
    assert page.context["charge"].total == Decimal("0.0039")  # finance sees the charge too
    b1 = client.get("/requests/b1/")
    assert b1.context["charge"].currency == "EUR"


def test_graduated_tiers_price_the_request_as_the_periods_last_tokens(client, ledger, billed):
    """Output graduated: 6 per million up to 300 tokens, 4 from 300. The
    period's output of the model is a1's 250 + a2's 100 = 350. a1 is priced
    after the other 100: 200 tokens (100 to 300) at 6 / 1M = 0.0012 and 50
    (300 to 350) at 4 / 1M = 0.0002; input 0.0015 and GPU 0.0009 as flat.
    Total 0.0038 USD, labelled an apportionment."""
    price, _ = billed
    VolumeTier.objects.create(model_price=price, kind="output", from_tokens=0, per_mtok=6)
    VolumeTier.objects.create(model_price=price, kind="output", from_tokens=300, per_mtok=4)
    client.force_login(make_member(ledger.a).user)

    page = client.get("/requests/a1/")

    charge = page.context["charge"]
    assert charge.graduated
    assert [
        (p.kind, p.quantity, p.unit_price, p.amount, p.tier_from)
        for p in charge.parts
        if p.kind == "output"
    ] == [
        ("output", Decimal(200), Decimal(6), Decimal("0.0012"), 0),
        ("output", Decimal(50), Decimal(4), Decimal("0.0002"), 300),
    ]
    assert charge.total == Decimal("0.0038")
    html = page.content.decode()
    assert "An apportionment:" in html and "tier from 300 tokens" in html
    assert 'data-testid="trace-charge-total">0.0038 USD<' in html
