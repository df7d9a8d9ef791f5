"""The finance cost page: runs with their progress, cost by tier split into
carried and unallocated, utilization by pool; finance staff only."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from html import unescape

from django.test import Client
from django.utils import timezone

from billing.costs.runs import allocation_run_create
from metering.models import UsageRollup
from tests.factories import PASSWORD, make_finance_user, make_member
from tests.focus import focus_problems, read_focus_csv


def _client(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def test_finance_sees_runs_costs_and_utilization(world):
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    pool = world.pool("shared-eu", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 900, hour=hour)
    world.allocate(start=hour)
    allocation_run_create(start=hour, end=hour + timedelta(hours=2))  # queued, not yet run

    page = _client(make_finance_user()).get("/costs/")

    assert page.status_code == 200
    html = page.content.decode()
    assert '<meta http-equiv="refresh"' in html  # a queued run: the page watches it
    assert "shared-eu" in html and "25.0% busy" in html
    assert 'value="1"' in html and "1/1 h" in html and "0/2 h" in html
    # $1 + 0 energy: a quarter carried by Alpha, the idle rest unallocated (platform policy).
    assert "1.00 USD (0.75 USD unallocated)" in html
    # Hour by hour over the week: the pool's one hour at 25 % busy.
    series = page.context["series"]
    assert series["labels"] == [hour.strftime("%Y-%m-%d %H:00")]
    assert series["datasets"] == [{"label": "shared-eu", "data": [25.0]}]
    assert 'id="utilization-chart"' in html


def test_the_utilization_chart_goes_day_by_day_over_a_month(world):
    hour = timezone.now().replace(hour=3, minute=0, second=0, microsecond=0) - timedelta(days=2)
    pool = world.pool("shared-eu", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 900, hour=hour)
    world.use(world.a, replica, 2700, hour=hour + timedelta(hours=1))
    world.allocate(start=hour, end=hour + timedelta(hours=2))

    series = _client(make_finance_user()).get("/costs/?days=30").context["series"]

    assert series["labels"] == [hour.strftime("%Y-%m-%d")]
    assert series["datasets"][0]["data"] == [50.0]  # (900 + 2,700) / 7,200


def test_tenant_members_cannot_see_costs(world):
    member = make_member(world.a)
    assert _client(member.user).get("/costs/").status_code == 403


def test_finance_drills_into_a_model(world, client):
    from billing.reports.margin_reports import margin_report_build, margin_report_request

    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    world.price()
    pool = world.pool("shared-eu", policy="spread")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 900, hour=hour)
    world.use(world.b, replica, 2700, hour=hour)
    for tenant, tokens in ((world.a, 1_000), (world.b, 5_000)):
        UsageRollup.objects.filter(tenant=tenant).update(completion_tokens=tokens)
    world.allocate(start=hour)
    margin_report_build(
        report_id=margin_report_request(kind="mtd", start=hour, end=hour + timedelta(hours=1)).pk
    )
    client.force_login(make_finance_user())

    page = client.get(f"/finance/models/{world.model.name}/")

    assert page.status_code == 200
    heaviest = page.context["tenants"]
    assert [(t["tenant"], t["tokens"]) for t in heaviest] == [
        (world.b.slug, 5_000),
        (world.a.slug, 1_000),
    ]
    (pool_row,) = page.context["pools"]
    assert pool_row["pool"] == "shared-eu" and Decimal(pool_row["cost"]) > 0
    margin = page.context["margin"]
    assert margin["model"] == world.model.name
    # The drill-down adds up to the model's row: by pool and by tenant.
    for rows in (page.context["pools"], heaviest):
        assert sum(Decimal(r["cost"]) for r in rows) == Decimal(margin["cost"])
        assert sum(r["tokens"] for r in rows) == margin["tokens"] == 6_000
    assert "6,000 tokens" in page.content.decode()
    assert client.get("/finance/models/no-such-model/").status_code == 404
    overview = client.get("/finance/").content.decode()
    assert f'href="/finance/models/{world.model.name}/"' in overview


def test_the_fleet_cost_export_link_downloads_the_weeks_gpu_cost(world):
    world.replica("r1", world.pool("shared-eu"), [world.gpu("g1")])
    finance = _client(make_finance_user())
    html = finance.get("/costs/").content.decode()
    href = re.search(r'href="([^"]+)" data-testid="export-focus-fleet"', html)[1]

    response = finance.get(unescape(href))

    assert response.status_code == 200, response.content
    rows = read_focus_csv(b"".join(response.streaming_content))
    assert set(rows["ResourceName"]) == {"g1"}
    assert set(rows["Tags"]) == {'{"pool": "shared-eu", "pool_kind": "shared"}'}
    # The page's week: 168 hours of one GPU at $1 an hour (no other rate).
    assert rows["BilledCost"].sum() == Decimal(168)
    assert not focus_problems(rows)
