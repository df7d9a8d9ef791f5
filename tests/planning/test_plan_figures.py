"""A plan's figures, worked by hand: capacity at the SLO read from the
replica's load hours, GPUs needed against held (a pool whose demand
doubles is flagged under-provisioned), and the price floor of one pool
and model over one month to the cent."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing.models import SlaCreditRule, SloPolicy
from planning.models import CapacityEstimate, PoolPlan, PriceFloor
from planning.runs import plan_run_create, plan_run_execute
from tests.billing.conftest import make_world
from tests.planning.fleet import KNEE, NOW, demand_write, load_write, shared_fleet

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(db):
    world = make_world()
    policy = SloPolicy.objects.create(
        name="Shared default",
        tier="shared",
        ttft_p95_ms=Decimal(2000),
        itl_p95_ms=Decimal(250),
        credit_cap_percent=Decimal(30),
    )
    SlaCreditRule.objects.create(policy=policy, metric="ttft_p95", credit_percent=Decimal(5))
    SlaCreditRule.objects.create(policy=policy, metric="itl_p95", credit_percent=Decimal(5))
    return world


def plan(**choices):
    return plan_run_execute(run_id=plan_run_create(as_of=NOW, **choices).pk)


def test_the_price_floor_of_one_pool_and_model_over_a_month_is_the_cent_worked_by_hand(world):
    """One leased GPU at 2.00 an hour, 100 W idle and 400 W busy, energy
    0.10 a kWh at a PUE of 1.5; 360,000 tokens every hour (252,000 prompt,
    of them 36,000 cached; 108,000 completion) at 0.005 device-seconds a
    token: busy half of every hour.

    An hour costs 2.00 + (100 + 300 x 0.5) W x 1 h x 1.5 x 0.10 = 2.0375;
    the forecast month (720 hours) 1,467.00. At 40% margin it must earn
    1,467.00 / 0.6 = 2,445.00. Its 259.2 M tokens are 155.52 M input,
    25.92 M cached and 77.76 M output: at today's 1 / 0.25 / 4 a million,
    155.52 + 6.48 + 311.04 = 473.04. Every price x 2,445 / 473.04 =
    5.16869...: input 5.17, cached 1.30 (1.29217 up), output 20.68
    (20.67479 up). Today's margin: (473.04 - 1,467) / 473.04 = -210.1%."""
    _pool, replica = shared_fleet(world)
    world.price(tier="shared")
    demand_write(world, replica, weeks=5, tokens=lambda h: 360_000, seconds_per_token=0.005)

    run = plan(target_margin_percent=Decimal(40))

    assert run.status == "done", run.error
    floor = PriceFloor.objects.get(run=run)
    assert (floor.tier, floor.model_name) == ("shared", "tiny")
    assert floor.tokens == {"input": 155_520_000, "cached": 25_920_000, "output": 77_760_000}
    assert floor.cost == Decimal("1467.00")
    assert floor.revenue == Decimal("473.04")
    assert floor.margin_percent == Decimal("-210.1")
    assert floor.today == {"input": "1", "cached": "0.25", "output": "4"}
    assert floor.floor == {"input": "5.17", "cached": "1.30", "output": "20.68"}
    pool = PoolPlan.objects.get(run=run)
    assert pool.cost == Decimal("1467.00")
    assert pool.busy_percent == Decimal("50.00")


def test_capacity_is_read_where_the_latency_curve_crosses_the_slo(world):
    _pool, replica = shared_fleet(world)
    load_write(replica)
    run = plan()
    capacity = CapacityEstimate.objects.get(run=run)
    assert capacity.status == "measured"
    assert (capacity.ttft_target_ms, capacity.itl_target_ms) == (Decimal(2000), Decimal(250))
    assert abs(capacity.tokens_per_hour - KNEE) < KNEE * 0.01
    ttfts = [point["ttft_p95_ms"] for point in capacity.curve]
    assert ttfts == sorted(ttfts) and len(ttfts) == 8


def test_a_replica_with_few_hours_is_too_thin_and_its_pool_need_unknown(world):
    _pool, replica = shared_fleet(world)
    load_write(replica, days=0)
    demand_write(world, replica, weeks=5, tokens=lambda h: 100_000, seconds_per_token=0.005)
    run = plan()
    capacity = CapacityEstimate.objects.get(run=run)
    assert capacity.status == "too_thin"
    assert capacity.tokens_per_hour is None
    assert "0 hours" in capacity.note
    pool = PoolPlan.objects.get(run=run)
    assert pool.flags == ["unknown"]
    assert pool.gpus_needed is None


def test_a_pool_whose_demand_doubles_is_flagged_under_provisioned_with_its_credits_at_risk(world):
    """Capacity 380,000 tokens an hour on its one GPU. At 200,000 an hour
    with 20% headroom it needs 240,000: one replica, as held. When the
    last two weeks double it (400,000; 480,000 with headroom) it needs
    two: under-provisioned. (Sized on the point forecast: the 95% band
    of a series that just jumped is wider, its backtest having missed the
    jump.)"""
    _pool, replica = shared_fleet(world)
    world.price(tier="shared")
    load_write(replica)
    demand_write(world, replica, weeks=6, tokens=lambda h: 200_000, seconds_per_token=0.005)

    before = PoolPlan.objects.get(run=plan())
    assert before.flags == ["ok"]
    assert (before.gpus_held, before.gpus_needed) == (Decimal(1), Decimal(1))
    assert before.credits_at_risk == Decimal(0)

    from metering.models import UsageRollup

    UsageRollup.objects.all().delete()
    demand_write(
        world,
        replica,
        weeks=6,
        tokens=lambda h: 200_000 if h < 4 * 168 else 400_000,
        seconds_per_token=0.005,
    )
    after = PoolPlan.objects.get(run=plan(band="point"))
    assert after.flags == ["under"]
    assert after.gpus_needed == Decimal(2)
    assert after.by_model[0]["peak_tokens_per_hour"] >= 400_000
    # At risk: Alpha's revenue of the four weeks before (336 hours at
    # 200,000 and 336 at 400,000: 201.6 M tokens, 1.825 a million as
    # above: 367.92) over the month (x 720 / 672), times the 5% + 5% its
    # TTFT and inter-token credits pay: 39.42.
    assert after.credits_at_risk == Decimal("39.42")
    assert after.idle_cost == Decimal(0)


def test_a_pool_holding_a_replica_more_than_it_needs_is_over_with_its_idle_cost(world):
    pool, replica = shared_fleet(world)
    spare = world.gpu("leased-2", lease_rate_per_hour=Decimal("2.00"))
    world.replica("r2", pool, [spare])
    load_write(replica)
    demand_write(world, replica, weeks=5, tokens=lambda h: 100_000, seconds_per_token=0.005)
    planned = PoolPlan.objects.get(run=plan())
    assert planned.flags == ["over"]
    assert (planned.gpus_held, planned.gpus_needed) == (Decimal(2), Decimal(1))
    # A GPU of the two, over the month: half the pool's cost.
    assert planned.idle_cost == (planned.cost / 2).quantize(Decimal("0.01"))


def test_the_plan_is_a_report_in_csv_and_html_beside_the_margin_reports(world):
    import csv
    import io

    from tests.conftest import client_for_user
    from tests.factories import make_finance_user

    _pool, replica = shared_fleet(world)
    world.price(tier="shared")
    demand_write(world, replica, weeks=5, tokens=lambda h: 360_000, seconds_per_token=0.005)
    run = plan(target_margin_percent=Decimal(40))
    finance = client_for_user(make_finance_user())

    answer = finance.get(f"/api/v1/plan/runs/{run.pk}/csv")
    assert answer.status_code == 200 and answer["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(answer.content.decode())))
    floors = {r["token_kind"]: r["price_floor"] for r in rows if r["section"] == "price_floor"}
    assert floors == {"input": "5.17", "cached": "1.30", "output": "20.68"}
    (pool,) = [r for r in rows if r["section"] == "pool"]
    assert (pool["pool"], pool["cost"], pool["currency"]) == ("shared", "1467.00", "USD")
    assert {r["section"] for r in rows} >= {"capacity", "forecast_tokens", "forecast_requests"}

    html = finance.get(f"/api/v1/plan/runs/{run.pk}/html").content.decode()
    assert 'data-testid="report-floors"' in html and "20.68" in html
    assert finance.get("/api/v1/plan/runs/999999/csv").status_code == 404
    from tests.factories import make_member

    assert (
        client_for_user(make_member(world.a).user)
        .get(f"/api/v1/plan/runs/{run.pk}/csv")
        .status_code
        == 403
    )
