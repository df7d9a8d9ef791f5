"""The fleet page: pools with GPUs and replicas up of all, replicas up or
down, GPUs with their cost facts, reservations, booked cost rates (not a
scenario's); finance staff only."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from billing.models import CostRate, CostScenario
from demo.seeds.billing import cost_rates_demo_seed
from demo.seeds.fleet import fleet_demo_seed
from serving.choices import ReplicaStatus
from serving.services import replica_set_status
from tenants.models import Membership
from tests.factories import make_finance_user


@pytest.fixture
def demo_fleet(db):
    call_command("seed_demo", stdout=StringIO())
    cost_rates_demo_seed()
    placements = fleet_demo_seed()
    replica_set_status(replica=placements["demo-shared"].replica, status=ReplicaStatus.UP)
    scenario = CostScenario.objects.create(
        name="cheap power",
        start=datetime(2026, 1, 1, tzinfo=UTC),
        end=datetime(2027, 1, 1, tzinfo=UTC),
    )
    CostRate.objects.create(
        component="energy",
        basis="per_kwh",
        amount=Decimal("0.011"),
        effective_from=datetime(2026, 1, 1, tzinfo=UTC),
        scenario=scenario,
    )
    return placements


def test_finance_sees_pools_replicas_gpus_reservations_and_rates(client, demo_fleet):
    client.force_login(make_finance_user())

    page = client.get("/fleet/")

    assert page.status_code == 200
    pools = {p.name: p for p in page.context["pools"]}
    assert set(pools) == {"demo-shared", "demo-reserved-globex", "demo-dedicated-acme"}
    shared = pools["demo-shared"]
    assert (shared.gpu_count, shared.replicas_up, shared.replicas_total) == (2, 1, 1)
    assert pools["demo-dedicated-acme"].replicas_up == 0
    statuses = {r.name: r.status for r in page.context["replicas"]}
    assert statuses == {
        "vllm-shared": "up",
        "vllm-reserved-globex": "down",
        "vllm-dedicated-acme": "down",
    }
    gpus = {g.serial: g for g in page.context["gpus"]}
    assert gpus["demo-shared-gpu1"].pool_name == "demo-shared"
    assert gpus["demo-shared-gpu1"].capex == Decimal("28000")
    (reservation,) = page.context["reservations"]
    assert (reservation.tenant.slug, reservation.gpu_count) == ("globex", 1)
    rates = list(page.context["rates"])
    assert len(rates) == 8 and all(r.scenario_id is None for r in rates)
    html = page.content.decode()
    assert "28,000.00 USD / 48 months / 2,800.00" in html
    assert "7:00\u201321:00" in html and "0.011" not in html


def test_tenant_members_and_anonymous_visitors_cannot_see_the_fleet(client, demo_fleet):
    assert client.get("/fleet/").status_code == 302
    client.force_login(Membership.objects.filter(tenant__slug="acme").first().user)
    assert client.get("/fleet/").status_code == 403
