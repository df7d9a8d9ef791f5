"""What is owed. Finance: open invoices (finalized, not paid, void or
uncollectible; credit notes deducted) by how long overdue, totalled per
currency and never across currencies, and every budgeted tenant against
its budget. A tenant: what it owes, how to pay it (Stripe's hosted
invoice page once synced) and this period's invoice so far; nobody
else's numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize, invoice_transition
from billing.invoicing.selectors import receivables_aging
from billing.models import Invoice, ModelPrice, PriceBook
from billing.payments.sync import invoice_stripe_sync
from billing.spend.budgets import budgets_check
from tenants.models import Tenant, TenantPolicy
from tests.factories import make_finance_user, make_member, make_tenant

MONTH = {m: datetime(2026, m, 1, tzinfo=UTC) for m in range(5, 12)}


def _issue(world, tenant, month: int, completion: int) -> Invoice:
    """The month's usage ($4 per million output tokens), invoiced when
    the month ended (due 30 days later)."""
    start, end = MONTH[month], MONTH[month + 1]
    world.tokens(tenant, hour=start + timedelta(hours=2), completion=completion)
    draft, _ = invoice_draft_build(tenant=tenant, period_start=start, period_end=end)
    return invoice_finalize(invoice_id=draft.pk, now=end)


def _this_month() -> datetime:
    return timezone.now().replace(day=1, hour=0, minute=0, second=0, microsecond=0)


@pytest.fixture
def owed(world, settings):
    """Alpha bills in USD, Bravo in EUR; months May to October 2026."""
    settings.BILLING = {**settings.BILLING, "NET_DAYS": 30}
    Tenant.objects.filter(pk=world.b.pk).update(billing_currency="EUR")
    world.b.refresh_from_db()
    world.price(since=MONTH[5])
    world.price(since=MONTH[5], currency="EUR")  # Bravo's book
    a = {
        m: _issue(world, world.a, m, tokens)
        for m, tokens in ((5, 250_000), (7, 500_000), (8, 1_000_000), (9, 2_000_000))
    }
    a[10] = _issue(world, world.a, 10, 1_000_000)
    b = {
        m: _issue(world, world.b, m, tokens)
        for m, tokens in ((6, 1_000_000), (8, 750_000), (9, 1_000_000), (10, 1_000_000))
    }
    invoice_transition(invoice_id=a[8].pk, to=InvoiceStatus.PAID)
    credit_note_create(invoice_id=a[9].pk, amount_minor=100, reason="outage")
    invoice_transition(invoice_id=b[6].pk, to=InvoiceStatus.VOID)
    invoice_transition(invoice_id=b[9].pk, to=InvoiceStatus.UNCOLLECTIBLE)
    return {"a": a, "b": b}


def test_receivables_are_aged_and_totalled_per_currency(world, owed):
    aging = receivables_aging(as_of=datetime(2026, 11, 15, tzinfo=UTC))

    # Due dates: October's Dec 1 (current), September's Oct 31 (15 days
    # overdue), August's Oct 1 (45), July's Aug 31 (76), May's Jul 1 (137).
    assert aging.totals == {
        "EUR": {"current": 400, "1-30": 0, "31-60": 300, "61-90": 0, "90+": 0, "total": 700},
        "USD": {"current": 400, "1-30": 700, "31-60": 0, "61-90": 200, "90+": 100, "total": 1400},
    }
    assert aging.open_count == 6
    listed = {(i.number, i.days_overdue, i.due_minor) for i in aging.invoices}
    assert (owed["a"][9].number, 15, 700) in listed and (owed["a"][5].number, 137, 100) in listed
    assert (owed["a"][10].number, 0, 400) in listed
    not_open = {owed["a"][8].number, owed["b"][6].number, owed["b"][9].number}
    assert not not_open & {i.number for i in aging.invoices}
    # A boundary: due (Dec 1, 00:00) is current all through its due date;
    # from the next midnight, 1 day overdue.
    due = owed["a"][10].due_at
    for moment in (due, due + timedelta(hours=23, minutes=59, seconds=59)):
        assert receivables_aging(as_of=moment).totals["USD"]["current"] == 400
    later = receivables_aging(as_of=due + timedelta(days=1)).totals["USD"]
    assert (later["current"], later["1-30"], later["31-60"]) == (0, 400, 700)


def _jpy_book(world, since: datetime) -> None:
    """A yen price book for the world's model (600 JPY per million output tokens)."""
    book = PriceBook.objects.create(name="list-jpy", currency="JPY", effective_from=since)
    ModelPrice.objects.create(
        book=book,
        served_model=world.model,
        input_per_mtok=Decimal("150"),
        cached_input_per_mtok=Decimal("40"),
        output_per_mtok=Decimal("600"),
    )


def test_days_overdue_count_calendar_days_from_the_due_date(client, world, settings, pinned_clock):
    """Due 10-31 is 31 days overdue on 12-01, whatever the hour; due today is
    not overdue at all. On finance's receivables page and a tenant's own."""
    settings.BILLING = {**settings.BILLING, "NET_DAYS": 30}
    Tenant.objects.filter(pk=world.b.pk).update(billing_currency="JPY")
    world.b.refresh_from_db()
    world.price(since=MONTH[9])
    world.price(since=MONTH[9], currency="EUR")  # Bravo's book
    _jpy_book(world, since=MONTH[9])
    issued = {}
    for tenant, month, finalized in (
        (world.a, 9, datetime(2026, 10, 1, 10, tzinfo=UTC)),  # due 2026-10-31 10:00
        (world.b, 10, datetime(2026, 11, 1, 8, tzinfo=UTC)),  # due 2026-12-01 08:00
    ):
        start, end = MONTH[month], MONTH[month + 1]
        world.tokens(tenant, hour=start + timedelta(hours=2), completion=1_000_000)
        draft, _ = invoice_draft_build(tenant=tenant, period_start=start, period_end=end)
        issued[tenant.slug] = invoice_finalize(invoice_id=draft.pk, now=finalized)
    alpha, bravo = issued[world.a.slug], issued[world.b.slug]
    assert (alpha.currency, bravo.currency) == ("USD", "JPY")
    pinned_clock.move_to(datetime(2026, 12, 1, 11, tzinfo=UTC))
    client.force_login(make_finance_user())

    html = client.get("/finance/receivables/").content.decode()

    row = html.split(f">{alpha.number}</a>")[1].split("</tr>")[0]
    assert "2026-10-31" in row and '<td class="num">31</td>' in row and "4.00 USD" in row
    row = html.split(f">{bravo.number}</a>")[1].split("</tr>")[0]
    assert "2026-12-01" in row and '<td class="num">—</td>' in row and "600 JPY" in row
    assert 'data-testid="aging-JPY-current">600 JPY' in html
    assert 'data-testid="aging-USD-31-60">4.00 USD' in html

    client.force_login(make_member(world.a).user)
    balance = client.get("/usage/").content.decode().split('data-testid="balance">')[1]
    assert "31 days overdue" in balance.split("</section>")[0]
    client.force_login(make_member(world.b).user)
    balance = client.get("/usage/").content.decode().split('data-testid="balance">')[1]
    balance = balance.split("</section>")[0]
    assert bravo.number in balance and "overdue" not in balance


def test_finance_sees_receivables_and_budgets_on_one_page(client, world, owed):
    start = _this_month()
    TenantPolicy.objects.filter(tenant=world.a).update(
        monthly_budget=Decimal("10"), budget_soft_percent=80, budget_hard_percent=100
    )
    TenantPolicy.objects.filter(tenant=world.b).update(monthly_budget=Decimal("5"))
    world.tokens(world.a, hour=start, completion=2_250_000)  # 9.00 USD: past the soft 8.00
    world.tokens(world.b, hour=start, completion=1_500_000)  # 6.00 EUR: past the hard 5.00
    budgets_check()  # the minute job: blocks Bravo
    make_tenant(name="Charlie")  # no budget
    client.force_login(make_finance_user())

    response = client.get("/finance/receivables/")

    assert response.status_code == 200
    html = response.content.decode()
    now_aging = receivables_aging(as_of=response.context["aging"].as_of)
    assert now_aging.totals["USD"]["total"] == 1400 and now_aging.totals["EUR"]["total"] == 700
    assert 'data-testid="aging-USD-total"><strong>14.00 USD<' in html
    assert 'data-testid="aging-EUR-total"><strong>7.00 EUR<' in html
    assert "21.00" not in html  # euros are never added to dollars
    for key, _ in now_aging.buckets:
        shown = html.split(f'data-testid="aging-USD-{key}">')[1].split("<")[0]
        assert shown == f"{Decimal(now_aging.totals['USD'][key]) / 100:.2f} USD"
    alpha = html.split(f'data-testid="budget-{world.a.slug}">')[1].split("</tr>")[0]
    assert "9.00 USD" in alpha and "10.00 USD" in alpha and "90.0 %" in alpha
    assert "over the soft threshold" in alpha and "blocked" not in alpha
    bravo = html.split(f'data-testid="budget-{world.b.slug}">')[1].split("</tr>")[0]
    assert "6.00 EUR" in bravo and 'data-testid="blocked"' in bravo
    assert "1 other tenant without a monthly budget" in html
    assert '<a href="/finance/receivables/">Receivables</a>' in html

    client.force_login(make_member(world.a).user)
    assert client.get("/finance/receivables/").status_code == 403


def test_a_tenant_sees_what_it_owes_and_this_periods_estimate_and_nobody_elses(client, world, owed):
    start = _this_month()
    world.tokens(world.a, hour=start, completion=2_250_000)  # 9.00 USD so far
    world.tokens(world.b, hour=start, completion=1_500_000)  # 6.00 EUR so far

    client.force_login(make_member(world.a, role="viewer").user)
    html = client.get("/usage/").content.decode()

    balance = html.split('data-testid="balance">')[1].split("</section>")[0]
    assert "Outstanding: <strong>14.00 USD</strong>" in balance
    for month in (5, 7, 9, 10):
        assert owed["a"][month].number in balance
    assert owed["a"][8].number not in balance  # paid
    assert "7.00 EUR" not in html and "EUR" not in balance
    assert not any(invoice.number in html for invoice in owed["b"].values())
    estimate = balance.split('data-testid="estimate">')[1].split("</p>")[0]
    assert "<strong>9.00 USD</strong>" in estimate
    assert "No payment link yet: pay as agreed, quoting" in balance  # Stripe not configured

    client.force_login(make_member(world.b).user)
    html = client.get("/usage/").content.decode()
    balance = html.split('data-testid="balance">')[1].split("</section>")[0]
    assert "Outstanding: <strong>7.00 EUR</strong>" in balance  # void and uncollectible left out
    assert "<strong>6.00 EUR</strong>" in balance.split('data-testid="estimate">')[1]
    assert "USD" not in balance
    assert not any(invoice.number in html for invoice in owed["a"].values())


def test_a_synced_invoice_is_paid_through_stripes_hosted_page(client, world, stripe_fake):
    world.price(since=MONTH[5])
    world.price(since=MONTH[5], currency="EUR")  # Bravo's book
    alpha = _issue(world, world.a, 10, 1_000_000)
    bravo = _issue(world, world.b, 10, 2_000_000)
    invoice_stripe_sync(invoice_id=alpha.pk)  # what the worker does after finalizing
    alpha.refresh_from_db()
    assert alpha.hosted_invoice_url

    client.force_login(make_member(world.a).user)
    html = client.get("/usage/").content.decode()

    assert f'<a href="{alpha.hosted_invoice_url}" rel="noopener" data-testid="pay-link">' in html
    client.force_login(make_member(world.b).user)
    html = client.get("/usage/").content.decode()
    assert alpha.hosted_invoice_url not in html and bravo.number in html
    assert 'data-testid="pay-link"' not in html  # Bravo's is not synced yet
