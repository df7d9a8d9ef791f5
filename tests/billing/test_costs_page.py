"""The finance cost page: runs with their progress, cost by tier split into
carried and unallocated, utilization by pool; finance staff only."""

from __future__ import annotations

from datetime import timedelta

from django.test import Client
from django.utils import timezone

from billing.allocation_run import allocation_run_create
from tests.factories import PASSWORD, make_finance_user, make_member


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
    assert "1.00 (0.75 unallocated)" in html
    # Hour by hour over the week: the pool's one hour at 25 % busy.
    series = page.context["series"]
    assert series["labels"] == [hour.strftime("%Y-%m-%d %H:00")]
    assert series["datasets"] == [{"label": "shared-eu", "data": [25.0]}]
    assert 'id="utilization-data"' in html


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
