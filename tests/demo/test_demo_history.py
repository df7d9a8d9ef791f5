"""The synthetic-history command on the demo world: earlier months of
synthetic usage, their cost allocated, a finalized invoice per tenant per
closed month, a margin report per month; real usage and today untouched."""

from __future__ import annotations

from datetime import UTC, datetime
from io import StringIO

from django.core.management import call_command

from billing.choices import InvoiceStatus, ReportKind, RunStatus
from billing.models import AllocationRun, FxRate, Invoice, MarginReport
from demo.history import DEMO_TRAFFIC, demo_history_fill
from demo.seeds.tenants import DEMO_TENANTS
from metering.models import UsageRollup

NOW = datetime(2026, 11, 22, 15, 30, tzinfo=UTC)


def _seed():
    from demo.seeds.billing import cost_rates_demo_seed, prices_demo_seed

    call_command("seed_demo", stdout=StringIO())
    cost_rates_demo_seed()
    prices_demo_seed()


def test_two_months_of_history_are_usage_cost_invoices_and_reports(db):
    _seed()
    report = demo_history_fill(months=2, now=NOW)

    assert (report.start, report.end) == (
        datetime(2026, 9, 1, tzinfo=UTC),
        datetime(2026, 11, 22, tzinfo=UTC),
    )
    rows = UsageRollup.objects.all()
    assert rows.count() == report.rows > 0
    assert not rows.filter(synthetic=False).exists()
    assert not rows.filter(hour__gte=report.end).exists()  # today stays for real usage
    assert set(rows.values_list("tenant__slug", flat=True)) == set(DEMO_TRAFFIC)
    assert AllocationRun.objects.get().status == RunStatus.DONE

    invoices = Invoice.objects.filter(status=InvoiceStatus.FINALIZED)
    assert invoices.count() == report.invoices == 2 * len(DEMO_TENANTS)
    assert sorted({i.period_start.month for i in invoices}) == [9, 10]
    assert all(i.total_minor > 0 for i in invoices)

    closes = MarginReport.objects.filter(kind=ReportKind.CLOSE).order_by("period_start")
    assert [r.period_start.month for r in closes] == [9, 10]
    mtd = MarginReport.objects.get(kind=ReportKind.MONTH_TO_DATE)
    assert (mtd.period_start, mtd.period_end) == (datetime(2026, 11, 1, tzinfo=UTC), report.end)
    # The traffic grows, so does revenue; every tier is in every report.
    revenues = [float(r.totals["revenue"]) for r in closes]  # ok-float: comparing
    assert revenues[1] > revenues[0] > 0
    assert {row["tier"] for row in mtd.tables["tier"]} >= {"shared", "reserved", "dedicated"}
    # Initech and Umbrella bill in EUR: converted at the demo's rates, marked as such.
    for margin_report in (*closes, mtd):
        assert margin_report.status == RunStatus.DONE, margin_report.error
        used = margin_report.fx_rates[0]  # then the previous period's, if it had any
        assert used["pair"] == "EUR/USD"
        assert used["period_start"] == margin_report.period_start.isoformat()
        assert set(margin_report.totals["revenue_by_currency"]) == {"EUR", "USD"}
    latest = FxRate.objects.latest("date")  # business days, as the ECB publishes
    assert latest.date.isoformat() == "2026-11-20" and latest.source.startswith("demo")


def test_the_command_is_safe_to_run_again(db):
    out = StringIO()
    call_command("synthetic_history", "--months", "1", stdout=out, stderr=StringIO())
    rows = UsageRollup.objects.count()
    invoices = Invoice.objects.count()
    call_command("synthetic_history", "--months", "1", stdout=out, stderr=StringIO())

    assert UsageRollup.objects.count() == rows > 0
    assert Invoice.objects.count() == invoices
    assert not Invoice.objects.filter(lines__late=True).exists()  # same rows: nothing late
    assert "usage rows" in out.getvalue()


def test_past_invoices_are_issued_and_fall_due_on_their_own_dates(
    db, client, settings, pinned_clock
):
    """September's invoices, issued at 02:00 on October 1, are due 30 days
    later: on November 22 they are 22 days overdue and October's are
    current (all were "current", due a month after the history was
    written). The receivables page shows each one's own due date."""
    from datetime import timedelta

    from billing.invoicing.selectors import receivables_aging
    from tests.factories import make_finance_user

    pinned_clock.move_to(NOW)  # the page rates this month so far: up to the history's now
    _seed()
    demo_history_fill(months=2, now=NOW)
    invoices = Invoice.objects.filter(status=InvoiceStatus.FINALIZED)
    for invoice in invoices:
        issued = invoice.period_end + timedelta(hours=2)
        assert invoice.finalized_at == issued
        assert invoice.due_at == issued + timedelta(days=settings.BILLING["NET_DAYS"])
    aging = receivables_aging(as_of=NOW)
    september = invoices.filter(period_start__month=9)
    october = invoices.filter(period_start__month=10)
    for currency in ("USD", "EUR"):
        assert aging.counts[currency]["1-30"] == september.filter(currency=currency).count() > 0
        assert aging.counts[currency]["current"] == october.filter(currency=currency).count() > 0

    client.force_login(make_finance_user())
    page = client.get("/finance/receivables/").content.decode()
    first = september.order_by("pk").first()
    row = page.split(f">{first.number}</a>")[1].split("</tr>")[0]
    assert "2026-10-31" in row  # its own due date


def test_the_slo_pages_say_the_history_has_no_per_request_data(db, client):
    """The history is hourly totals: the SLO pages say those days have
    nothing to measure, for finance and for a tenant; a tenant with no
    synthetic usage is told nothing of the kind."""
    from django.utils import timezone

    from tenants.models import Tenant
    from tests.factories import make_finance_user, make_member, make_tenant

    _seed()
    demo_history_fill(months=1, now=timezone.now())
    client.force_login(make_finance_user())
    notice = client.get("/finance/slo/").content.decode().split('data-testid="slo-synthetic"')
    assert len(notice) == 2 and "No per-request data from" in notice[1]
    assert "synthetic hourly totals" in notice[1]

    client.force_login(make_member(Tenant.objects.get(slug="hooli")).user)
    assert 'data-testid="slo-synthetic"' in client.get("/usage/").content.decode()
    client.force_login(make_member(make_tenant(name="Fresh Co")).user)
    assert 'data-testid="slo-synthetic"' not in client.get("/usage/").content.decode()
