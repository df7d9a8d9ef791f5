"""The cost API: finance staff only; rates with history and future edits;
bad input is a 400 naming the field with nothing written; runs queued and
watched; results by tier, tenant and model; cost per million tokens;
utilization; scenarios beside the booked results."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing import tasks
from billing.costs.runs import allocation_run_execute
from billing.models import CostAllocation, CostRate
from metering.models import UsageRollup
from tests.billing.conftest import H0
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key

D = Decimal
RATES = "/api/v1/costs/rates"
PERIOD = {"start": H0.isoformat(), "end": (H0 + timedelta(hours=1)).isoformat()}


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


@pytest.fixture
def queued(monkeypatch):
    """Runs the API hands to Celery (the broker is not under test here)."""
    sent: list[int] = []
    monkeypatch.setattr(tasks.allocation_run_task, "delay", sent.append)
    return sent


@pytest.fixture
def costed(world):
    world.rate("energy", "0.10", "per_kwh")
    shared = world.pool("shared", policy="spread")
    replica = world.replica("r1", shared, [world.gpu("g1")])
    dedicated = world.pool("ded-b", kind="dedicated", owner=world.b)
    world.replica("r2", dedicated, [world.gpu("g2")])
    world.use(world.a, replica, 1800)
    UsageRollup.objects.filter(tenant=world.a).update(
        prompt_tokens=600_000, completion_tokens=400_000
    )
    return world


def test_tenants_cannot_read_or_write_costs(world):
    _, secret = make_key(world.a)
    tenant = client_for_key(secret)
    for path in (RATES, "/api/v1/costs/runs", "/api/v1/costs/allocations"):
        assert tenant.get(path).status_code == 403
    body = {
        "component": "energy",
        "basis": "per_kwh",
        "amount": "1",
        "effective_from": "2026-01-01",
    }
    assert tenant.post(RATES, body, format="json").status_code == 403
    assert not CostRate.objects.exists()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"amount": "-0.01"}, "amount"),
        ({"pool": 999999}, "pool"),
        ({"basis": "per_gpu_month"}, "basis"),
        ({"component": "wind"}, "component"),
        ({"effective_to": "2026-03-01"}, "effective_to"),  # before effective_from
        ({"hour_from": 25}, "hour_from"),
        (
            {"effective_from": "2026-05-01", "effective_to": "2026-07-01"},
            "effective_from",
        ),  # overlap
    ],
)
def test_bad_rate_is_a_400_naming_the_field_and_writes_nothing(finance, world, change, field):
    world.rate(
        "energy",
        "0.10",
        "per_kwh",
        effective_from=datetime(2026, 4, 1, tzinfo=UTC),
        effective_to=datetime(2026, 9, 1, tzinfo=UTC),
    )
    body = {
        "component": "energy",
        "basis": "per_kwh",
        "amount": "0.12",
        "effective_from": "2026-04-01",
    } | change
    response = finance.post(RATES, body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["field"] == field
    assert CostRate.objects.count() == 1


def test_a_rate_change_keeps_history_and_only_future_rates_are_editable(finance, world):
    first = finance.post(
        RATES,
        {
            "component": "energy",
            "basis": "per_kwh",
            "amount": "0.10",
            "effective_from": "2026-01-01",
        },
        format="json",
    ).json()
    later = (datetime.now(UTC) + timedelta(days=30)).date().isoformat()
    second = finance.post(
        RATES,
        {"component": "energy", "basis": "per_kwh", "amount": "0.12", "effective_from": later},
        format="json",
    ).json()

    history = finance.get(RATES, {"component": "energy"}).json()
    assert [r["amount"] for r in history] == ["0.120000000", "0.100000000"]
    assert history[1]["effective_to"].startswith(later)  # the old rate closes where the new starts

    past = finance.patch(f"{RATES}/{first['id']}", {"amount": "0.2"}, format="json")
    assert past.status_code == 400 and past.json()["error"]["field"] == "effective_from"
    future = finance.patch(f"{RATES}/{second['id']}", {"amount": "0.11"}, format="json")
    assert future.status_code == 200 and future.json()["amount"] == "0.110000000"
    assert finance.delete(f"{RATES}/{first['id']}").status_code == 400
    assert finance.delete(f"{RATES}/{second['id']}").status_code == 204
    assert CostRate.objects.count() == 1


def test_a_run_is_queued_and_its_progress_and_results_readable(
    finance, costed, queued, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks(execute=True):
        response = finance.post("/api/v1/costs/runs", PERIOD, format="json")
    assert response.status_code == 202 and response.json()["status"] == "queued"
    run_id = response.json()["id"]
    assert queued == [run_id]

    allocation_run_execute(run_id=run_id)  # what the worker does

    run = finance.get(f"/api/v1/costs/runs/{run_id}").json()
    assert (run["status"], run["hours_done"], run["progress"]) == ("done", 1, 1.0)
    assert "no PUE" in " ".join(run["warnings"])

    by_tier = finance.get("/api/v1/costs/allocations", {**PERIOD, "group_by": "tier"}).json()
    totals = {r["tier"]: D(r["total"]) for r in by_tier["results"]}
    # Dedicated: $1 + idle energy 0.1 kW x $0.10; shared: $1 + (0.1 + 0.3 x 0.5) kW x $0.10.
    assert totals == {"dedicated": D("1.01"), "shared": D("1.025")}
    assert {r["tier"]: D(r["unallocated"]) for r in by_tier["unallocated"]} == {
        "dedicated": 0,
        "shared": 0,
    }
    by_tenant_model = finance.get(
        "/api/v1/costs/allocations", {**PERIOD, "group_by": "tenant,model"}
    ).json()["results"]
    assert [(r["tenant"], r["model"]) for r in by_tenant_model] == [
        (costed.a.slug, "tiny"),
        (costed.b.slug, None),
    ]

    per_token = finance.get("/api/v1/costs/per-million-tokens", PERIOD).json()
    assert per_token == [
        {
            "model": "tiny",
            "pool": "shared",
            "cost": "1.025000000",
            "prompt_tokens": 600000,
            "completion_tokens": 400000,
            "cost_per_million_tokens": "1.025000000",
        }
    ]
    utilization = finance.get("/api/v1/costs/utilization", PERIOD).json()
    assert {(u["pool"], u["utilization"]) for u in utilization} == {("ded-b", 0.0), ("shared", 0.5)}


def test_bad_queries_are_400s_naming_the_field(finance, world):
    bad = finance.get("/api/v1/costs/allocations", {**PERIOD, "group_by": "colour"})
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "group_by"
    backwards = finance.post(
        "/api/v1/costs/runs", {"start": PERIOD["end"], "end": PERIOD["start"]}, format="json"
    )
    assert backwards.status_code == 400 and backwards.json()["error"]["field"] == "end"
    ragged = finance.post(
        "/api/v1/costs/runs", {"start": "2026-10-05T12:30:00Z", "end": PERIOD["end"]}, format="json"
    )
    assert ragged.status_code == 400 and ragged.json()["error"]["field"] == "start"


def test_a_scenario_sits_apart_from_the_booked_results_and_compares(finance, costed, queued):
    booked = finance.post("/api/v1/costs/runs", PERIOD, format="json").json()
    allocation_run_execute(run_id=booked["id"])
    before = sorted(CostAllocation.objects.filter(scenario=None).values_list("tenant", "total"))

    response = finance.post(
        "/api/v1/costs/scenarios",
        {
            "name": "platform idle, dearer power",
            **PERIOD,
            "idle_cost_policy": "platform",
            "rates": [
                {
                    "component": "energy",
                    "basis": "per_kwh",
                    "amount": "0.20",
                    "effective_from": "2026-01-01",
                }
            ],
        },
        format="json",
    )
    assert response.status_code == 202, response.json()
    allocation_run_execute(run_id=response.json()["id"])
    scenario_id = response.json()["scenario"]

    assert (
        sorted(CostAllocation.objects.filter(scenario=None).values_list("tenant", "total"))
        == before
    )
    compare = finance.get(f"/api/v1/costs/scenarios/{scenario_id}/compare", {"by": "tenant"}).json()
    rows = {r["key"]: r for r in compare}
    # Alpha: booked all of the shared pool ($1.025); now half of $1.05 and no idle share.
    assert (D(rows[costed.a.slug]["booked"]), D(rows[costed.a.slug]["scenario"])) == (
        D("1.025"),
        D("0.525"),
    )
    assert D(rows["(unallocated)"]["scenario"]) == D("0.525")
    tiers = finance.get(f"/api/v1/costs/scenarios/{scenario_id}/compare", {"by": "tier"}).json()
    assert {r["key"] for r in tiers} == {"dedicated", "shared", "(unallocated)"}

    bad = finance.post(
        "/api/v1/costs/scenarios",
        {
            "name": "x",
            **PERIOD,
            "rates": [
                {
                    "component": "energy",
                    "basis": "per_kwh",
                    "amount": "-1",
                    "effective_from": "2026-01-01",
                }
            ],
        },
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "rates.0.amount"
