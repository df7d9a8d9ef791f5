"""History reproduces (issue 59, item 3; invariant 9): re-rating closed
periods gives, to the cent, what was billed for them, after a tier move, a
new price version and late usage; the standing check (the beat task) says
so on the finance overview, and finds an in-place price edit (the old
defect) naming the invoice and line."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import ModelPrice, ReproductionCheck
from billing.tasks import reproduction_check_task
from tests.billing.conftest import NOV, OCT
from tests.billing.pricing.test_tier_history import _move
from tests.factories import make_finance_user, make_tenant

D = Decimal


def _october(world, admin_client):
    """Alpha (USD) moves from shared to dedicated on the 15th; Yen KK (JPY)
    gets a new price version from the 20th; both Octobers are finalized."""
    world.price(tier="shared", since=OCT - timedelta(days=60))
    world.price(version=2, tier="dedicated", since=OCT - timedelta(days=60), output_per_mtok=D(6))
    world.price(
        currency="JPY", tier="shared", since=OCT - timedelta(days=60), output_per_mtok=D(600)
    )
    world.price(
        currency="JPY",
        tier="shared",
        version=2,
        since=datetime(2026, 10, 20, tzinfo=UTC),
        output_per_mtok=D(700),
    )
    yen = make_tenant(name="Yen KK", billing_currency="JPY")
    for day in (5, 25):
        for tenant in (world.a, yen):
            hour = datetime(2026, 10, day, 12, tzinfo=UTC)
            world.tokens(tenant, hour=hour, completion=1_000_000)
    _move(admin_client, world.a, "dedicated", at=datetime(2026, 10, 15, tzinfo=UTC))
    invoices = {}
    for tenant in (world.a, yen):
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        invoices[tenant.slug] = invoice_finalize(invoice_id=draft.pk)
    return yen, invoices


def test_closed_periods_re_rated_reproduce_their_invoices(world, admin_client, client):
    yen, invoices = _october(world, admin_client)
    assert invoices[world.a.slug].subtotal_minor == 400 + 600  # shared, then dedicated
    assert invoices[yen.slug].subtotal_minor == 600 + 700  # v1, then v2 from the 20th
    # Late usage for Yen KK's October, not billed yet: pending, not a difference.
    world.tokens(yen, hour=datetime(2026, 10, 28, tzinfo=UTC), completion=1_000_000)

    assert reproduction_check_task() == 0
    check = ReproductionCheck.objects.get()
    assert (check.invoices, check.pending_late_usage, check.differences) == (2, 1, [])

    client.force_login(make_finance_user())
    line = _overview_line(client)
    assert "2 finalized invoices, 0 differences from what was billed" in line
    assert "1 with late usage to bill on the next invoice" in line


def test_a_price_edited_in_place_is_found_naming_the_invoice_and_line(world, admin_client, client):
    """The defect the guards now refuse (an in-force price edited, 6 -> 7
    USD/M): done behind their back, the standing check finds it."""
    _, invoices = _october(world, admin_client)
    ModelPrice.objects.filter(book__tier="dedicated").update(output_per_mtok=D(7))

    # A line's key holds its unit price: 600 billed at 6, 700 re-rated at 7.
    assert reproduction_check_task() == 2
    differences = ReproductionCheck.objects.get().differences
    assert {d["invoice"] for d in differences} == {invoices[world.a.slug].number}
    assert sorted((d["billed_minor"], d["rated_minor"]) for d in differences) == [
        (0, 700),
        (600, 0),
    ]
    assert all("tokens / tiny / output / list v2" in d["line"] for d in differences)

    client.force_login(make_finance_user())
    assert "2 differences from what was billed" in _overview_line(client)


def _overview_line(client) -> str:
    page = client.get("/finance/").content.decode()
    start = page.index('data-testid="reproduction"')
    return re.sub(r"<[^>]+>", "", page[start : page.index("</p>", start)])


def test_a_price_converted_at_a_rate_re_rates_to_the_very_line_billed(world):
    """A EUR tenant on the USD list at 1.08 USD/EUR: 4 USD/M is
    3.703703703... EUR/M, kept on the line to 9 places. Re-rating compared
    the unrounded price with the kept one and found two differences (and a
    late-usage run would have billed +2.81 and -2.81 EUR)."""
    from billing.invoicing.reproduction import reproduction_check
    from billing.models import FxRate

    world.price(since=OCT - timedelta(days=60))
    day = OCT.date()
    while day < datetime(2026, 12, 1).date():
        FxRate.objects.create(base="EUR", quote="USD", date=day, rate=D("1.08"))
        day += timedelta(days=1)
    euro = make_tenant(name="Euro GmbH", billing_currency="EUR")
    world.tokens(euro, hour=datetime(2026, 10, 5, 12, tzinfo=UTC), completion=2_000_000)
    draft, _ = invoice_draft_build(tenant=euro, period_start=OCT, period_end=NOV)
    october = invoice_finalize(invoice_id=draft.pk)
    (line,) = october.lines.all()
    assert line.unit_price == D("3.703703704") and october.subtotal_minor == 741
    assert "USD prices at 0.925925925926 USD/EUR" in line.description

    assert reproduction_check().differences == []
    world.tokens(euro, hour=datetime(2026, 11, 3, 12, tzinfo=UTC), completion=1_000_000)
    november, why = invoice_draft_build(
        tenant=euro, period_start=NOV, period_end=datetime(2026, 12, 1, tzinfo=UTC)
    )
    assert november is not None, why
    assert not november.lines.filter(late=True).exists()  # nothing to adjust
