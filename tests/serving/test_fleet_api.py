"""The fleet inventory API: finance staff only; bad input is a 400 naming
the field and writes nothing."""

import pytest

from serving.models import Gpu, Pool, Reservation
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance():
    return client_for_user(make_finance_user())


@pytest.fixture
def sku_node(finance):
    sku = finance.post(
        "/api/v1/fleet/gpu-skus",
        {
            "name": "H100 SXM",
            "power_idle_watts": 70,
            "power_busy_watts": 700,
            "list_price": "30000",
        },
        format="json",
    )
    node = finance.post("/api/v1/fleet/nodes", {"name": "node-a", "site": "fra1"}, format="json")
    assert sku.status_code == node.status_code == 201
    return sku.json()["id"], node.json()["id"]


def test_tenants_cannot_see_the_fleet(world_a):
    for client in (client_for_key(world_a.secret), client_for_user(world_a.owner.user)):
        assert client.get("/api/v1/fleet/gpus").status_code == 403
        assert (
            client.post(
                "/api/v1/fleet/pools", {"name": "x", "kind": "shared"}, format="json"
            ).status_code
            == 403
        )


def test_finance_registers_owned_and_leased_gpus(finance, sku_node):
    sku, node = sku_node
    owned = finance.post(
        "/api/v1/fleet/gpus",
        {
            "serial": "GPU-1",
            "sku": sku,
            "node": node,
            "in_service_date": "2026-01-01",
            "capex": "30000",
            "useful_life_months": 48,
            "salvage_value": "3000",
        },
        format="json",
    )
    leased = finance.post(
        "/api/v1/fleet/gpus",
        {
            "serial": "GPU-2",
            "sku": sku,
            "node": node,
            "in_service_date": "2026-01-01",
            "lease_rate_per_hour": "2.150000000",
        },
        format="json",
    )
    assert owned.status_code == leased.status_code == 201
    assert leased.json()["lease_rate_per_hour"] == "2.150000000"
    assert {g["serial"] for g in finance.get("/api/v1/fleet/gpus").json()} == {"GPU-1", "GPU-2"}


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        (
            {"capex": "100", "useful_life_months": 12, "lease_rate_per_hour": "1"},
            "lease_rate_per_hour",
        ),
        ({}, "capex"),
        ({"capex": "100"}, "useful_life_months"),
        ({"capex": "100", "useful_life_months": 12, "salvage_value": "200"}, "salvage_value"),
        ({"capex": "-1", "useful_life_months": 12}, "capex"),
        ({"lease_rate_per_hour": "1", "sku": 99999}, "sku"),
    ],
)
def test_bad_gpu_is_400_naming_the_field(finance, sku_node, payload, field):
    sku, node = sku_node
    body = {"serial": "GPU-X", "sku": sku, "node": node, "in_service_date": "2026-01-01", **payload}
    response = finance.post("/api/v1/fleet/gpus", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert not Gpu.objects.exists()


def test_pool_owner_rules(finance, world_a):
    bad = finance.post("/api/v1/fleet/pools", {"name": "p", "kind": "dedicated"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "owner"
    bad = finance.post(
        "/api/v1/fleet/pools",
        {"name": "p", "kind": "shared", "owner": world_a.tenant.pk},
        format="json",
    )
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "owner"
    ok = finance.post(
        "/api/v1/fleet/pools",
        {"name": "p", "kind": "reserved", "owner": world_a.tenant.pk},
        format="json",
    )
    assert ok.status_code == 201
    assert Pool.objects.count() == 1


def test_reservation_rules(finance, world_a):
    shared = Pool.objects.create(name="s", kind="shared")
    reserved = Pool.objects.create(name="r", kind="reserved", owner=world_a.tenant)
    base = {
        "tenant": world_a.tenant.pk,
        "gpu_count": 2,
        "start": "2026-12-01T00:00:00Z",
        "end": "2027-12-01T00:00:00Z",
    }
    cases = [
        ({**base, "pool": shared.pk}, "pool"),
        ({**base, "pool": reserved.pk, "end": "2026-11-01T00:00:00Z"}, "end"),
        ({**base, "pool": reserved.pk, "gpu_count": 0}, "gpu_count"),
    ]
    for payload, field in cases:
        response = finance.post("/api/v1/fleet/reservations", payload, format="json")
        assert response.status_code == 400, response.content
        assert response.json()["error"]["field"] == field
    assert not Reservation.objects.exists()
    assert (
        finance.post(
            "/api/v1/fleet/reservations", {**base, "pool": reserved.pk}, format="json"
        ).status_code
        == 201
    )


def test_duplicate_name_is_400(finance, sku_node):
    response = finance.post("/api/v1/fleet/nodes", {"name": "node-a"}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "name"
