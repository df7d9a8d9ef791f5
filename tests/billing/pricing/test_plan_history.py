"""A plan moved mid-period prices each stretch under the plan in force then
(issue 59, item 3): the move made through finance's API, the period split
there, each plan's discount on its own stretch's usage and its minimum
commitment prorated to its share of the period's hours. Before, the plan in
force at the period's start priced the whole month. A USD tenant and a JPY
one (no minor units); the finalized invoices then re-rate to the cent."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.invoicing.reproduction import reproduction_check
from billing.models import Plan, Subscription
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

D = Decimal
DEC = datetime(2026, 12, 1, tzinfo=UTC)


def _lines(invoice) -> dict[str, int]:
    return {line.description: line.amount_minor for line in invoice.lines.all()}


def test_a_plan_moved_mid_month_prices_each_stretch_under_its_own_terms(world, pinned_clock):
    world.price(since=OCT)
    world.price(currency="JPY", since=OCT, output_per_mtok=D(600))
    yen = make_tenant(name="Yen KK", billing_currency="JPY")
    discounted = Plan.objects.create(name="Ten off", discount_percent=D(10))
    committed = Plan.objects.create(name="Committed", minimum_commit=D(300))
    yen_committed = Plan.objects.create(name="Yen commit", currency="JPY", minimum_commit=50_000)
    yen_free = Plan.objects.create(name="Yen free", currency="JPY")
    for tenant, plan in ((world.a, discounted), (yen, yen_committed)):
        Subscription.objects.create(tenant=tenant, plan=plan, start=OCT)
    for tenant in (world.a, yen):
        for day in (5, 20):
            world.tokens(tenant, hour=datetime(2026, 11, day, 12, tzinfo=UTC), completion=10**6)

    pinned_clock.move_to(datetime(2026, 11, 10, 9, tzinfo=UTC))
    finance = client_for_user(make_finance_user())
    for tenant, plan in ((world.a, committed), (yen, yen_free)):
        moved = finance.post(
            f"/api/v1/tenants/{tenant.slug}/subscriptions",
            {"plan": plan.pk, "effective_from": "2026-11-16"},
            format="json",
        )
        assert moved.status_code == 201, moved.json()

    pinned_clock.move_to(datetime(2026, 12, 1, 2, tzinfo=UTC))
    invoices = {}
    for tenant in (world.a, yen):
        draft, why = invoice_draft_build(tenant=tenant, period_start=NOV, period_end=DEC)
        assert draft is not None, why
        invoices[tenant.slug] = invoice_finalize(invoice_id=draft.pk)

    # Alpha: 4.00 + 4.00 USD of usage; 10% off the first stretch's only
    # (not 0.80 off both); Committed's 300 USD for half the month's hours
    # (15 of 30 days) is 150.00, trued up against that stretch's 4.00.
    alpha = invoices[world.a.slug]
    assert _lines(alpha) == {
        "tiny: output tokens": 800,
        "Ten off: 10.00% off usage (2026-11-01 00:00 to 2026-11-16 00:00 UTC)": -40,
        "Committed: minimum commitment 150.00 USD, 50.0% of 300.00 USD "
        "(2026-11-16 00:00 to 2026-12-01 00:00 UTC)": 14_600,
    }
    assert alpha.total_minor == 15_360  # was 720: the month under Ten off alone
    # Yen KK: 600 + 600 JPY; its 50,000 JPY commitment held only for the
    # first half: 25,000 against that stretch's 600 (was 50,000 in all).
    yen_invoice = invoices[yen.slug]
    assert _lines(yen_invoice) == {
        "tiny: output tokens": 1_200,
        "Yen commit: minimum commitment 25,000 JPY, 50.0% of 50,000 JPY "
        "(2026-11-01 00:00 to 2026-11-16 00:00 UTC)": 24_400,
    }
    assert yen_invoice.total_minor == 25_600

    # History reproduces: the finalized invoices re-rate to the yen and cent.
    assert reproduction_check().differences == []
