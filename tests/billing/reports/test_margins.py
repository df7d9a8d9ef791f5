"""Margin reports worked by hand: revenue from rating, cost from the booked
allocation, margin = revenue - cost to the cent at every level, with
utilization, cost per million tokens, revenue per GPU-hour, unabsorbed
idle cost and the period before."""

from __future__ import annotations

import json
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.reports.margins import margin_data, margin_table, margin_totals
from tests.billing.conftest import H0
from tests.conftest import PINNED_NOW

D = Decimal
HOUR = timedelta(hours=1)


def test_one_shared_gpu_by_hand(world):
    """One $1/h GPU, half busy for Alpha, idle kept as platform cost;
    Alpha's 1 M output tokens at $4/M."""
    world.price()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate()

    data = margin_data(start=H0, end=H0 + HOUR)
    tier = margin_table(data, "tier").set_index("tier").loc["shared"]

    assert tier["revenue"] == 4 * 10**9
    assert tier["cost"] == 1 * 10**9  # $0.50 carried by Alpha + $0.50 unabsorbed
    assert tier["unabsorbed"] == 5 * 10**8
    assert tier["margin"] == 3 * 10**9 and tier["margin_pct"] == 75
    assert tier["utilization_pct"] == 50 and tier["gpu_hours"] == 1
    assert tier["revenue_per_gpu_hour"] == 4
    assert tier["cost_per_mtok"] == 1  # $1 over 1 M tokens

    tenants = margin_table(data, "tenant").set_index("tenant")
    assert tenants.loc[world.a.slug, "margin"] == D("3.5") * 10**9
    assert tenants.loc["(unabsorbed)", "margin"] == -(5 * 10**8)
    assert margin_totals(data) == {"revenue": 4 * 10**9, "cost": 10**9, "margin": 3 * 10**9}


def test_margin_is_revenue_minus_cost_at_every_level_and_month_over_month(world):
    world.price(reservation=D("0.5"))
    shared = world.pool("shared")
    reserved = world.pool("reserved", kind="reserved", owner=world.b)
    r1 = world.replica("r1", shared, [world.gpu("g1"), world.gpu("g2")])
    r2 = world.replica("r2", reserved, [world.gpu("g3")])
    world.reserve(world.b, reserved, 1)
    world.gpu("spare")  # held by no replica: the (spare) tier
    for hour, scale in ((H0 - HOUR, 1), (H0, 2)):
        world.use(world.a, r1, seconds=700 * scale, completion=333_333 * scale, hour=hour)
        world.use(world.b, r1, seconds=1100, completion=123_457, hour=hour)
        world.use(world.b, r2, seconds=2000 * scale, completion=777_777, hour=hour)
    world.allocate(start=H0 - HOUR, end=H0 + HOUR)

    now, before = margin_data(start=H0, end=H0 + HOUR), margin_data(start=H0 - HOUR, end=H0)

    totals = margin_totals(now)
    from billing.models import PoolHourCost
    from tests.billing.conftest import charges_rate

    booked = sum(p.total for p in PoolHourCost.objects.filter(hour=H0))
    rated = sum(
        c.amount
        for t in (world.a, world.b)
        for c in charges_rate(tenant=t, start=H0, end=H0 + HOUR)
    )
    assert round(D(totals["cost"]) / 10**9, 2) == round(booked, 2)
    assert round(D(totals["revenue"]) / 10**9, 2) == round(rated, 2)
    for level in ("tier", "pool", "tenant", "model"):
        table = margin_table(now, level, previous=before)
        assert (table["margin"] == table["revenue"] - table["cost"]).all()
        assert table["margin"].sum() == totals["margin"]
        assert table["prev_margin"].sum() == margin_totals(before)["margin"]
    tiers = margin_table(now, "tier", previous=before).set_index("tier")
    assert set(tiers.index) == {"shared", "reserved", "(spare)"}
    assert tiers.loc["(spare)", "revenue"] == 0 and tiers.loc["(spare)", "cost"] > 0
    assert tiers.loc["reserved", "revenue"] > 0  # tokens plus the reservation fee


def test_reports_are_stored_as_csv_and_html_and_downloadable_by_finance_only(
    world, django_capture_on_commit_callbacks, monkeypatch
):
    import csv
    import io

    from billing import tasks
    from tests.conftest import client_for_key, client_for_user
    from tests.factories import make_finance_user, make_key

    world.price()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate()
    finance = client_for_user(make_finance_user())
    monkeypatch.setattr(tasks.margin_report_task, "delay", lambda pk: tasks.margin_report_task(pk))

    with django_capture_on_commit_callbacks(execute=True):
        queued = finance.post(
            "/api/v1/margin-reports",
            {"start": H0.isoformat(), "end": (H0 + HOUR).isoformat()},
            format="json",
        )
    assert queued.status_code == 202
    report = finance.get(f"/api/v1/margin-reports/{queued.json()['id']}").json()
    assert report["status"] == "done", report["error"]
    assert report["totals"] == {
        "revenue": "4.000000000",
        "cost": "1.000000000",
        "margin": "3.000000000",
        "currency": "USD",
        "revenue_by_currency": {"USD": "4.000000000"},
    }
    assert report["currency"] == "USD" and report["fx_rates"] == []

    download = finance.get(report["csv_url"])
    assert download["Content-Disposition"].endswith('.csv"')
    rows = list(csv.DictReader(io.StringIO(download.content.decode())))
    tier = next(r for r in rows if r["level"] == "tier" and r["tier"] == "shared")
    assert (tier["revenue"], tier["cost"], tier["margin"]) == (
        "4.000000000",
        "1.000000000",
        "3.000000000",
    )
    assert float(tier["margin_pct"]) == 75 and float(tier["utilization_pct"]) == 50
    assert {r["tenant"] for r in rows if r["level"] == "tenant"} == {world.a.slug, "(unabsorbed)"}
    html = finance.get(report["html_url"]).content.decode()
    assert 'data-testid="by-tier"' in html and "3.00" in html

    bad = finance.post(
        "/api/v1/margin-reports", {"start": H0.isoformat(), "end": H0.isoformat()}, format="json"
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "end"
    _, secret = make_key(world.a)
    assert client_for_key(secret).get("/api/v1/margin-reports").status_code == 403
    assert client_for_key(secret).get(report["csv_url"]).status_code == 403


def test_scheduled_reports_cover_the_last_week_and_month():
    from datetime import UTC, datetime

    from billing.reports.margin_reports import report_period

    wednesday = datetime(2026, 11, 18, 3, tzinfo=UTC)
    assert report_period(kind="flash", now=wednesday) == (
        datetime(2026, 11, 9, tzinfo=UTC),
        datetime(2026, 11, 16, tzinfo=UTC),
    )
    assert report_period(kind="close", now=wednesday) == (
        datetime(2026, 10, 1, tzinfo=UTC),
        datetime(2026, 11, 1, tzinfo=UTC),
    )


def test_the_finance_overview_shows_the_month_to_date_report(world, client):
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from tests.factories import make_finance_user, make_member

    world.price()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate()
    report = margin_report_request(kind="mtd", start=H0, end=H0 + HOUR)
    margin_report_build(report_id=report.pk)
    client.force_login(make_finance_user())

    response = client.get("/finance/")

    assert response.status_code == 200
    chart = response.context["chart"]
    assert chart["labels"] == ["shared"]
    assert [d["data"] for d in chart["datasets"][:3]] == [[4.0], [1.0], [3.0]]
    html = response.content.decode()
    assert 'id="tier-chart"' in html and world.a.slug in html and "(unabsorbed)" in html
    # The tenant table is built in the browser from strict JSON (no NaN).
    blob = html.split('id="tenant-rows" type="application/json">')[1].split("</script>")[0]
    rows = json.loads(blob, parse_constant=lambda c: pytest.fail(f"{c} in the page's JSON"))
    assert {row["tenant"] for row in rows} == {world.a.slug, "(unabsorbed)"}
    member = make_member(world.a)
    client.force_login(member.user)
    assert client.get("/finance/").status_code == 403


def test_the_finance_overview_without_a_report_says_how_to_get_one(client, db):
    from tests.factories import make_finance_user

    client.force_login(make_finance_user())
    assert "No margin report yet" in client.get("/finance/").content.decode()


def test_a_period_with_cost_against_one_without_capacity(world):
    """The period before had revenue (a reservation fee) but no pool-hours
    allocated at all: no GPU-hours, not a division error."""
    world.price(reservation=D("2"))
    world.reserve(world.b, world.pool("res", kind="reserved", owner=world.b), 1)
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate()
    before = margin_data(start=H0 - 2 * HOUR, end=H0)

    table = margin_table(margin_data(start=H0, end=H0 + HOUR), "tier", previous=before)
    earlier = margin_table(before, "pool", previous=margin_data(start=H0, end=H0 + HOUR))

    assert table.set_index("tier").loc["reserved", "prev_revenue"] == 4 * 10**9  # 2 h x $2
    rows = earlier.set_index("pool")
    assert rows.loc["res", "revenue"] == 4 * 10**9 and rows.loc["res", "gpu_hours"] == 0


def test_a_row_only_last_period_had_is_zero_now_and_the_report_builds(world):
    """Bravo used the GPU last hour only: its row this hour is all zeros
    (not blanks), and the stored report (CSV and HTML) is built."""
    from billing.choices import ReportKind, RunStatus
    from billing.reports.margin_reports import margin_report_build, margin_report_request

    world.price()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.b, replica, seconds=900, completion=500_000, hour=H0 - HOUR)
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate(start=H0 - HOUR, end=H0 + HOUR)

    table = margin_table(
        margin_data(start=H0, end=H0 + HOUR),
        "tenant",
        previous=margin_data(start=H0 - HOUR, end=H0),
    ).set_index("tenant")

    bravo = table.loc[world.b.slug]
    assert (bravo["revenue"], bravo["cost"], bravo["tokens"], bravo["capital"]) == (0, 0, 0, 0)
    assert bravo["prev_revenue"] > 0
    assert not table[["capital", "idle", "tokens", "device_seconds"]].isna().any().any()
    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=H0, end=H0 + HOUR).pk
    )
    assert report.status == RunStatus.DONE, report.error
    assert world.b.slug in report.csv


def test_a_tier_that_loses_money_is_marked_on_the_overview(world, client):
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from tests.factories import make_finance_user

    world.price(output_per_mtok=Decimal("0.1"))  # $0.10 of revenue against $1 of cost
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, seconds=1800, completion=1_000_000)
    world.allocate()
    margin_report_build(report_id=margin_report_request(kind="mtd", start=H0, end=H0 + HOUR).pk)
    client.force_login(make_finance_user())

    html = client.get("/finance/").content.decode()

    tier_row = html.split('data-testid="by-tier"')[1].split("</tr>")[1]
    assert '<td class="error">-0.90</td>' in tier_row


def test_by_tenant_tier_and_by_pool_kind_are_two_views_each_summing_to_the_total(
    world, client, pinned_clock
):
    """Initech bought the reserved tier but holds no reservation: its usage
    runs in the shared pool. By pool kind it is shared revenue; by tenant
    tier, reserved. Bravo (EUR, reserved tier) holds a reserved GPU."""
    import csv
    import io
    from datetime import date

    from billing.choices import ReportKind, RunStatus
    from billing.models import FxRate
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from tests.factories import make_finance_user, make_tenant

    world.price(reservation=D("0.5"))
    pinned_clock.move_to(H0 - timedelta(days=30))  # reserved since before the hour reported
    world.b.tier = "reserved"
    world.b.billing_currency = "EUR"
    world.b.save()
    pinned_clock.move_to(PINNED_NOW)
    for day in (H0.date(), H0.date() + timedelta(days=1), date(2026, 10, 4)):
        FxRate.objects.create(base="EUR", quote="USD", date=day, rate=D("1.1"), source="test")
    initech = make_tenant(name="Initech", tier="reserved")
    shared = world.pool("shared", policy="platform")
    reserved = world.pool("reserved", kind="reserved", owner=world.b)
    r1 = world.replica("r1", shared, [world.gpu("g1")])
    r2 = world.replica("r2", reserved, [world.gpu("g2")])
    world.reserve(world.b, reserved, 1)
    world.use(world.a, r1, seconds=600, completion=1_000_000)
    world.use(initech, r1, seconds=1200, completion=2_000_000)
    world.use(world.b, r2, seconds=1800, completion=500_000)
    world.allocate()

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=H0, end=H0 + HOUR).pk
    )
    assert report.status == RunStatus.DONE, report.error
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    by_kind = {r["tier"]: r for r in rows if r["level"] == "tier"}
    by_tier = {r["tenant_tier"]: r for r in rows if r["level"] == "tenant_tier"}
    initech_row = next(r for r in rows if r["level"] == "tenant" and r["tenant"] == initech.slug)
    alpha_row = next(r for r in rows if r["level"] == "tenant" and r["tenant"] == world.a.slug)
    bravo_row = next(r for r in rows if r["level"] == "tenant" and r["tenant"] == world.b.slug)
    # Where it ran: Initech's revenue is in the shared pool kind.
    assert D(by_kind["shared"]["revenue"]) == D(alpha_row["revenue"]) + D(initech_row["revenue"])
    # What was sold: Initech is reserved-tier revenue, beside Bravo's.
    assert D(by_tier["reserved"]["revenue"]) == D(initech_row["revenue"]) + D(bravo_row["revenue"])
    assert D(by_tier["shared"]["revenue"]) == D(alpha_row["revenue"])
    for view in (by_kind, by_tier):
        for figure in ("revenue", "cost", "margin"):
            assert sum(D(r[figure]) for r in view.values()) == D(report.totals[figure])

    client.force_login(make_finance_user())
    page = client.get("/finance/").content.decode()
    sold = page.split('data-testid="by-tenant-tier"')[1].split("</table>")[0]
    ran = page.split('data-testid="by-tier"')[1].split("</table>")[0]
    assert "Tenant tier" in sold and "<td>reserved</td>" in sold and "<td>shared</td>" in sold
    assert "Pool kind" in ran
    assert "what was sold" in page and "where it ran" in page


def test_a_tenant_moved_since_is_filed_under_the_tier_it_had_then(world, pinned_clock):
    """Alpha was shared through October and moved to dedicated in November:
    October's report, built again now, files its revenue under shared (it
    was filed under today's tier, so a re-run moved it)."""
    import csv
    import io
    from datetime import UTC, datetime

    from billing.choices import ReportKind, RunStatus
    from billing.reports.margin_reports import margin_report_build, margin_report_request

    world.price()
    shared = world.pool("shared", policy="platform")
    world.use(
        world.a, world.replica("r1", shared, [world.gpu("g1")]), seconds=600, completion=10**6
    )
    world.allocate()
    pinned_clock.move_to(datetime(2026, 11, 10, tzinfo=UTC))
    world.a.tier = "dedicated"
    world.a.save()  # tenants.TierChange from Nov 10

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=H0, end=H0 + HOUR).pk
    )
    assert report.status == RunStatus.DONE, report.error
    tiers = {
        row["tenant_tier"]
        for row in csv.DictReader(io.StringIO(report.csv))
        if row["level"] == "tenant_tier"
    }
    assert tiers - {"(unabsorbed)"} == {"shared"}
