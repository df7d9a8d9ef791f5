"""What-ifs on a plan, queued through the API and computed by the plan
task: more GPUs in an under-provisioned pool, a tenant moved to another
pool, a price changed; each side by side with the plan it changes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from planning import tasks
from planning.models import PlanRun, PoolPlan
from planning.runs import plan_run_create, plan_run_execute
from planning.tasks import plan_run_task
from tests.conftest import client_for_user
from tests.factories import make_finance_user
from tests.planning.fleet import NOW, demand_write, load_write, shared_fleet
from tests.planning.test_plan_figures import world  # noqa: F401 (the fixture)

URL = "/api/v1/plan/what-ifs"


@pytest.fixture
def planned(world, monkeypatch, django_capture_on_commit_callbacks):  # noqa: F811
    """tests.planning.test_plan_figures' doubled shared pool (under:
    needs 2 GPUs, holds 1), and a second shared pool `spare` with a replica
    of the same model, measured alike, and no demand."""
    _pool, replica = shared_fleet(world)
    world.price(tier="shared")
    load_write(replica)
    other = world.replica(
        "r2", world.pool("spare"), [world.gpu("leased-2", lease_rate_per_hour=Decimal("2.00"))]
    )
    load_write(other)
    demand_write(
        world,
        replica,
        weeks=6,
        tokens=lambda h: 200_000 if h < 4 * 168 else 400_000,
        seconds_per_token=0.005,
    )
    baseline = plan_run_execute(run_id=plan_run_create(as_of=NOW, band="point").pk)
    queued = []
    monkeypatch.setattr(tasks.plan_run_task, "delay", queued.append)
    return baseline, queued, django_capture_on_commit_callbacks


def what_if(finance, planned, body) -> PlanRun:
    _baseline, queued, on_commit = planned
    with on_commit(execute=True):
        answer = finance.post(URL, body, format="json")
    assert answer.status_code == 202, answer.json()
    plan_run_task(queued[-1])
    run = PlanRun.objects.get(pk=answer.json()["id"])
    assert run.status == "done", run.error
    return run


def pools(run) -> dict:
    return {p.pool_name: p for p in PoolPlan.objects.filter(run=run)}


def test_a_gpu_more_clears_the_flag_and_gives_headroom(world, planned):  # noqa: F811
    baseline = planned[0]
    finance = client_for_user(make_finance_user())
    run = what_if(finance, planned, {"gpus": [{"pool": "shared", "delta": 1}]})
    assert run.baseline == baseline and run.as_of == baseline.as_of and run.band == "point"
    before, after = pools(baseline)["shared"], pools(run)["shared"]
    assert before.flags == ["under"] and after.flags == ["ok"]
    assert (before.gpus_held, after.gpus_held) == (Decimal(1), Decimal(2))
    # Peak ~400,000 on capacity 380,000 a GPU: about -5% with one, +90% with two.
    assert before.headroom_percent < 0 < after.headroom_percent
    assert after.cost == before.cost * 2  # a leased GPU more at the pool's cost per GPU-hour
    assert after.busy_percent == (before.busy_percent / 2).quantize(Decimal("0.01"))

    page = finance.get("/finance/plan/").content.decode()
    assert 'data-testid="what-if"' in page and "+1 GPUs in shared" in page
    assert 'data-testid="what-if-flags-shared">ok<' in page


def test_a_tenant_moved_takes_its_demand_to_the_other_pool(world, planned):  # noqa: F811
    baseline = planned[0]
    finance = client_for_user(make_finance_user())
    run = what_if(finance, planned, {"move_tenant": {"tenant": world.a.slug, "pool": "spare"}})
    after = pools(run)
    assert after["shared"].flags == ["over"]  # nothing left: its GPU could go
    assert after["spare"].flags == ["under"]  # Alpha's 400,000 an hour on its one GPU
    moved = after["spare"].by_model[0]["peak_tokens_per_hour"]
    assert moved == pools(baseline)["shared"].by_model[0]["peak_tokens_per_hour"]


def test_a_price_raised_raises_the_margin_and_not_the_floor(world, planned):  # noqa: F811
    baseline = planned[0]
    finance = client_for_user(make_finance_user())
    run = what_if(
        finance, planned, {"prices": [{"tier": "shared", "model": "tiny", "percent": "10"}]}
    )
    before, after = pools(baseline)["shared"], pools(run)["shared"]
    assert after.revenue == (before.revenue * Decimal("1.1")).quantize(Decimal("0.01"))
    assert after.margin_percent > before.margin_percent
    assert run.floors.get().floor == baseline.floors.get().floor  # the cost did not move


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "move_tenant"),
        ({"move_tenant": {"tenant": "nobody", "pool": "spare"}}, "move_tenant.tenant"),
        ({"move_tenant": {"tenant": "A", "pool": "nowhere"}}, "move_tenant.pool"),
        ({"gpus": [{"pool": "shared", "delta": -2}]}, "gpus.0.delta"),
        ({"gpus": [{"pool": "nowhere", "delta": 1}]}, "gpus.0.pool"),
        ({"prices": [{"tier": "shared", "model": "tiny", "percent": "-100"}]}, "prices.0.percent"),
        ({"prices": [{"tier": "gold", "model": "tiny", "percent": "5"}]}, "prices.0.tier"),
        ({"baseline": 999999, "gpus": [{"pool": "shared", "delta": 1}]}, "baseline"),
    ],
)
def test_bad_what_ifs_name_their_field_and_queue_nothing(world, planned, body, field):  # noqa: F811
    queued = planned[1]
    if body.get("move_tenant", {}).get("tenant") == "A":
        body = {"move_tenant": {**body["move_tenant"], "tenant": world.a.slug}}
    finance = client_for_user(make_finance_user())
    answer = finance.post(URL, body, format="json")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"]["field"] == field, answer.json()
    assert queued == [] and PlanRun.objects.count() == 1
