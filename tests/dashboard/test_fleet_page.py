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


def test_the_page_shows_mig_instances_time_slices_and_what_is_free(client, db):
    from serving.gpu_shares import Share
    from serving.models import Gpu, GpuSku, Node, Pool, Replica, ServedModel
    from serving.services import replica_gpu_shares_set

    sku = GpuSku.objects.create(
        name="H100 80GB", memory_gb=80, power_idle_watts=70, power_busy_watts=700, mig_capable=True
    )
    node = Node.objects.create(name="n1")
    mig, sliced = (
        Gpu.objects.create(
            serial=serial, sku=sku, node=node, in_service_date="2026-01-01", lease_rate_per_hour=2
        )
        for serial in ("H100-MIG", "H100-TS")
    )
    pool = Pool.objects.create(name="shared", kind="shared")
    model = ServedModel.objects.create(name="m")
    for name, share in (
        ("r3g", Share(gpu_id=mig.pk, sharing="mig", mig_profile="3g.40gb", mig_instance=1)),
        ("r2g", Share(gpu_id=mig.pk, sharing="mig", mig_profile="2g.20gb", mig_instance=2)),
        ("rts", Share(gpu_id=sliced.pk, sharing="time_sliced", share_percent=60)),
    ):
        replica = Replica.objects.create(
            name=name,
            base_url=f"http://10.0.0.1/{name}",
            model=model,
            pool=pool,
            engine="trtllm" if name == "r2g" else "vllm",
        )
        replica_gpu_shares_set(replica=replica, shares=[share])
    client.force_login(make_finance_user())

    page = client.get("/fleet/")

    gpus = {g.serial: g for g in page.context["gpus"]}
    assert gpus["H100-MIG"].held == [
        "r3g: MIG 3g.40gb (instance 1)",
        "r2g: MIG 2g.20gb (instance 2)",
    ]
    assert gpus["H100-MIG"].free == "2 of 7 slices free"
    assert gpus["H100-TS"].held == ["rts: 60% time-sliced"]
    assert gpus["H100-TS"].free == "40% free"
    html = page.content.decode()
    assert "H100-MIG (MIG 3g.40gb (instance 1))" in html
    assert "2 of 7 slices free" in html
    engines = dict(zip((r.name for r in page.context["replicas"]), _cells(html), strict=True))
    assert engines == {"r2g": "TensorRT-LLM (trtllm-serve)", "r3g": "vLLM", "rts": "vLLM"}


def _cells(html: str) -> list[str]:
    """The engine cell of each replica row, in order."""
    import re

    return re.findall(r'data-testid="replica-engine">([^<]*)</td>', html)


def test_a_dynamo_worker_is_shown_with_its_role_behind_its_frontend(client, demo_fleet):
    from serving.choices import Engine
    from serving.engine_workers import engine_workers_sync
    from serving.engines import Listed
    from serving.services import replica_register

    shared = demo_fleet["demo-shared"]
    front = replica_register(
        name="dyn", base_url="http://127.0.0.1:9", model=shared.replica.model,
        pool=shared.pool, gpus=[], engine=Engine.DYNAMO,
    )  # fmt: skip
    engine_workers_sync(
        frontend=front,
        listed=[Listed("17", "prefill", "prefill"), Listed("18", "backend", "decode")],
    )
    client.force_login(make_finance_user())
    page = client.get("/fleet/")
    html = page.content.decode()
    assert html.count("worker behind dyn") == 2
    assert "NVIDIA Dynamo · prefill" in html and "NVIDIA Dynamo · decode" in html
    assert {r.name for r in page.context["replicas"]} >= {"dyn/prefill-11", "dyn/backend-12"}
