"""The plan page's figures as finance reads them (/finance/plan/, logged
in as finance): the peak shown is the one the plan sized GPUs for; a pool
serving a chat model and an embedding model counts each model's capacity
on its own replicas; a plan forecast from the demo's synthetic history
says so where it finds pools short."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from billing.models import SlaCreditRule, SloPolicy
from metering.models import UsageRollup
from planning.models import DemandForecast, PoolPlan
from planning.provisioning import model_need, pool_need, sized_peak
from planning.runs import plan_run_create, plan_run_execute
from serving.models import ServedModel
from tests.billing.conftest import make_world
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant
from tests.planning.fleet import NOW, demand_write, load_write, shared_fleet

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
    world.price(tier="shared")
    world.price(tier="shared", currency="JPY")
    make_tenant(name="Yen KK", billing_currency="JPY")  # a second currency: nothing leaks
    return world


def _plan(**choices):
    run = plan_run_execute(run_id=plan_run_create(as_of=NOW, **choices).pk)
    assert run.status == "done", run.error
    return run


def _page() -> str:
    return client_for_user(make_finance_user()).get("/finance/plan/").content.decode()


def _cells(html: str, testid: str) -> list[str]:
    table = html.split(f'data-testid="{testid}"')[1].split("</table>")[0]
    return re.findall(r"<td[^>]*>(.*?)</td>", table)


def _number(text: str) -> float:
    return float(text.replace(",", ""))


def test_the_peak_shown_is_the_peak_sized(world):
    """A daily swing with noise: the 95% band's top peaks at another
    height (and maybe hour) than the point forecast. The page shows the
    point forecast's peak and, apart, the peak the plan sized for: the
    pool plan's own figure."""
    _pool, replica = shared_fleet(world)
    load_write(replica)
    demand_write(
        world,
        replica,
        weeks=5,
        tokens=lambda h: 150_000 + (h % 24) * 4_000 + (h * 7919) % 23_000,
        seconds_per_token=0.005,
    )

    run = _plan(band="95")

    forecast = DemandForecast.objects.get(run=run, metric="tokens")
    sized = PoolPlan.objects.get(run=run).by_model[0]["peak_tokens_per_hour"]
    assert sized == round(sized_peak(forecast.point, forecast.bands, "95")[0], 1)
    assert sized > max(forecast.point)
    page = _page()
    assert "Peak sized (95% band's top)" in page
    cells = _cells(page, "plan-series")
    point_shown, sized_shown = _number(cells[5]), _number(cells[6])
    assert abs(sized_shown - sized) <= 1  # "0g": whole tokens
    assert abs(point_shown - max(forecast.point)) <= 1


def test_an_embedding_models_gpu_is_not_chat_capacity(world):
    """The shared pool: the chat model's replica on one GPU (380,000
    tokens an hour at the SLO) and an embedding model's replica on
    another. 400,000 chat tokens an hour (480,000 with headroom) need two
    chat GPUs: the chat model holds one, so the pool is under, its SLO
    headroom 380,000 / 400,000 - 1 = -5.0%, not 2 / (400/380) - 1 = +90%
    by counting the embedding GPU as chat capacity."""
    pool, replica = shared_fleet(world)
    embed = ServedModel.objects.create(name="embed-small")
    embedder = world.replica("e1", pool, [world.gpu("leased-e", lease_rate_per_hour=Decimal(2))])
    embedder.model = embed
    embedder.save()
    load_write(replica)
    demand_write(world, replica, weeks=5, tokens=lambda h: 400_000, seconds_per_token=0.002)

    planned = PoolPlan.objects.get(run=_plan(band="point"))

    assert planned.gpus_held == Decimal(2)
    assert planned.flags == ["under"]
    assert planned.headroom_percent == Decimal("-5.0")
    (chat,) = planned.by_model
    assert (chat["model"], chat["gpus_held"], chat["gpus_needed"]) == ("tiny", 1.0, 2.0)
    # The embedding GPU serves no chat demand: idle, its cost the idle cost.
    assert planned.idle_cost == (planned.cost / 2).quantize(Decimal("0.01"))
    row = _page().split('data-testid="plan-pools"')[1].split("</tr>")[1]
    assert "<td>shared</td>" in row and '<td class="num">-5.0</td>' in row
    assert "tiny: 2 replicas of 1 GPU, 1 GPU held, SLO headroom -5.0%" in row


def test_model_needs_are_set_against_each_models_own_gpus():
    chat = model_need(
        model="chat", peak=400, headroom_percent=20, capacities=[(380, 1)], replica_gpus=[1]
    )
    embed = model_need(
        model="embed", peak=10, headroom_percent=20, capacities=[(1000, 1)], replica_gpus=[1]
    )
    # Two GPUs held and needed in all, but chat needs two of its own.
    need = pool_need(gpus_held=2, models=[chat, embed], contracted=None)
    assert need.flags == ["under"]
    assert round(need.headroom_percent, 1) == -5.0  # the tightest model's
    assert need.gpus_surplus == 0.0  # chat is short; embed needs the one it holds
    idle = pool_need(gpus_held=3, models=[chat, embed], contracted=None)
    assert idle.gpus_surplus == 1.0  # a GPU serving neither model: idle, chat still short
    assert idle.flags == ["under"]
    assert sized_peak([1, 5, 3], {"95": ([0, 0, 0], [2, 4, 9])}, "95") == (9.0, 2)
    assert sized_peak([1, 5, 3], {"95": ([0, 0, 0], [2, 4, 9])}, "point") == (5.0, 1)
    assert sized_peak([], {}, "95") == (0.0, None)


def test_a_plan_from_the_demos_synthetic_history_says_why_its_pools_are_under(world):
    _pool, replica = shared_fleet(world)
    load_write(replica)
    demand_write(world, replica, weeks=5, tokens=lambda h: 800_000, seconds_per_token=0.001)

    _plan(band="point")
    assert "synthetic history" not in _page()  # real traffic: nothing to say

    UsageRollup.objects.update(synthetic=True)
    run = _plan(band="point")

    assert PoolPlan.objects.get(run=run).flags == ["under"]
    (warning,) = [w for w in run.warnings if "synthetic" in w]
    assert warning.startswith("100% of the tokens this plan forecast from")
    page = _page()
    assert "demo&#x27;s synthetic history" in page
    assert "the pools flagged &quot;under&quot; are so because that history is" in page
