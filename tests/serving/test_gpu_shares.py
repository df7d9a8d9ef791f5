"""A replica holds whole GPUs, MIG instances or time-sliced shares (issue
20): shares that do not exist or do not fit are a 400 naming the field,
and nothing is written."""

import pytest

from serving.models import Gpu, GpuSku, Node, Pool, Replica, ReplicaGpu, ServedModel
from tests.conftest import client_for_user
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance():
    return client_for_user(make_finance_user())


@pytest.fixture
def fleet():
    node = Node.objects.create(name="node-a")
    a100 = GpuSku.objects.create(
        name="A100 80GB", memory_gb=80, power_idle_watts=50, power_busy_watts=400, mig_capable=True
    )
    l4 = GpuSku.objects.create(name="L4", memory_gb=24, power_idle_watts=16, power_busy_watts=72)
    gpu = lambda serial, sku: Gpu.objects.create(  # noqa: E731
        serial=serial, sku=sku, node=node, in_service_date="2026-01-01", lease_rate_per_hour=2
    )
    return {
        "a100": gpu("A100-1", a100),
        "l4": gpu("L4-1", l4),
        "shared": Pool.objects.create(name="shared", kind="shared"),
        "other": Pool.objects.create(name="other", kind="shared"),
        "model": ServedModel.objects.create(name="m"),
    }


def _post(finance, fleet, name, shares, pool="shared"):
    return finance.post(
        "/api/v1/fleet/replicas",
        {
            "name": name,
            "base_url": f"http://10.0.0.1/{name}",
            "model": fleet["model"].pk,
            "pool": fleet[pool].pk,
            "gpu_shares": shares,
        },
        format="json",
    )


def test_mig_instances_partition_a_gpu_and_show_their_units(finance, fleet):
    gpu = fleet["a100"].pk
    three = _post(
        finance,
        fleet,
        "r3g",
        [{"gpu": gpu, "sharing": "mig", "mig_profile": "3g.40gb", "mig_instance": 1}],
    )
    four = _post(
        finance,
        fleet,
        "r4g",
        [{"gpu": gpu, "sharing": "mig", "mig_profile": "4g.40gb", "mig_instance": 2}],
    )
    assert three.status_code == four.status_code == 201, (three.content, four.content)
    assert three.json()["gpu_shares"] == [
        {
            "gpu": gpu,
            "sharing": "mig",
            "mig_profile": "3g.40gb",
            "mig_instance": 1,
            "share_percent": None,
            "units": 300,
        }
    ]
    assert three.json()["gpus"] == [gpu]
    assert sorted(ReplicaGpu.objects.values_list("units", flat=True)) == [300, 400]


@pytest.mark.parametrize(
    ("first", "second", "field"),
    [
        # 4g + 4g: 8 compute slices of 7.
        (
            {"sharing": "mig", "mig_profile": "4g.40gb", "mig_instance": 1},
            {"sharing": "mig", "mig_profile": "4g.40gb", "mig_instance": 2},
            "gpu_shares.mig_profile",
        ),
        # Two replicas on one MIG instance.
        (
            {"sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 3},
            {"sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 3},
            "gpu_shares.mig_instance",
        ),
        # A profile an 80 GB A100 does not have.
        (
            {"sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 1},
            {"sharing": "mig", "mig_profile": "3g.20gb", "mig_instance": 2},
            "gpu_shares.mig_profile",
        ),
        # Time slices over 100%.
        (
            {"sharing": "time_sliced", "share_percent": 60},
            {"sharing": "time_sliced", "share_percent": 50},
            "gpu_shares.share_percent",
        ),
        # MIG beside a time slice on one GPU.
        (
            {"sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 1},
            {"sharing": "time_sliced", "share_percent": 50},
            "gpu_shares.sharing",
        ),
        # A GPU held whole, then a MIG instance of it.
        (
            {"sharing": "whole"},
            {"sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 1},
            "gpu_shares.sharing",
        ),
        ({"sharing": "whole"}, {"sharing": "whole"}, "gpus"),
    ],
)
def test_a_share_that_does_not_fit_is_400_naming_the_field_and_writes_nothing(
    finance, fleet, first, second, field
):
    gpu = fleet["a100"].pk
    assert _post(finance, fleet, "r1", [{"gpu": gpu, **first}]).status_code == 201
    response = _post(finance, fleet, "r2", [{"gpu": gpu, **second}])
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field
    assert not Replica.objects.filter(name="r2").exists()
    assert ReplicaGpu.objects.count() == 1


def test_mig_on_a_gpu_that_cannot_is_refused(finance, fleet):
    response = _post(
        finance,
        fleet,
        "r1",
        [{"gpu": fleet["l4"].pk, "sharing": "mig", "mig_profile": "1g.10gb", "mig_instance": 1}],
    )
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "gpu_shares.mig_profile"
    assert "cannot be partitioned" in response.json()["error"]["message"]
    assert not Replica.objects.exists()


def test_time_sliced_replicas_share_one_pool(finance, fleet):
    gpu = fleet["a100"].pk
    share = {"gpu": gpu, "sharing": "time_sliced", "share_percent": 30}
    assert _post(finance, fleet, "r1", [share]).status_code == 201
    response = _post(finance, fleet, "r2", [share], pool="other")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "gpu_shares.pool"
    assert _post(finance, fleet, "r3", [share]).status_code == 201
    # Moving a time-sliced replica to another pool is re-checked too.
    r1 = Replica.objects.get(name="r1")
    moved = finance.patch(
        f"/api/v1/fleet/replicas/{r1.pk}", {"pool": fleet["other"].pk}, format="json"
    )
    assert moved.status_code == 400
    assert Replica.objects.get(name="r1").pool == fleet["shared"]


def test_whole_gpus_by_id_still_work_and_a_replica_swaps_its_shares(finance, fleet):
    made = finance.post(
        "/api/v1/fleet/replicas",
        {
            "name": "r1",
            "base_url": "http://10.0.0.1/r1",
            "model": fleet["model"].pk,
            "pool": fleet["shared"].pk,
            "gpus": [fleet["a100"].pk, fleet["l4"].pk],
        },
        format="json",
    )
    assert made.status_code == 201, made.content
    assert sorted(made.json()["gpus"]) == sorted([fleet["a100"].pk, fleet["l4"].pk])
    assert {s["units"] for s in made.json()["gpu_shares"]} == {700}
    changed = finance.patch(
        f"/api/v1/fleet/replicas/{made.json()['id']}",
        {"gpu_shares": [{"gpu": fleet["a100"].pk, "sharing": "time_sliced", "share_percent": 25}]},
        format="json",
    )
    assert changed.status_code == 200, changed.content
    assert list(ReplicaGpu.objects.values_list("gpu_id", "units")) == [(fleet["a100"].pk, 175)]


def test_a_replica_names_its_engine_and_an_unknown_one_is_a_400(finance, fleet):
    body = {
        "name": "tgi-1",
        "base_url": "http://10.0.0.1/tgi",
        "model": fleet["model"].pk,
        "pool": fleet["shared"].pk,
        "gpus": [fleet["a100"].pk],
    }
    made = finance.post("/api/v1/fleet/replicas", body | {"engine": "tgi"}, format="json")
    assert made.status_code == 201, made.content
    assert made.json()["engine"] == "tgi" and Replica.objects.get(name="tgi-1").engine == "tgi"
    unnamed = finance.post(
        "/api/v1/fleet/replicas", body | {"name": "v", "gpus": [fleet["l4"].pk]}, format="json"
    )
    assert unnamed.status_code == 201, unnamed.content
    assert unnamed.json()["engine"] == "vllm"  # as every replica before engines were named
    refused = finance.post(
        "/api/v1/fleet/replicas", body | {"name": "x", "engine": "llamacpp"}, format="json"
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["field"] == "engine"
    assert not Replica.objects.filter(name="x").exists()


def _admin_client():
    from django.contrib.auth import get_user_model
    from django.test import Client

    user = get_user_model().objects.create_superuser("root", "root@example.test", "pw")
    client = Client()
    client.force_login(user)
    return client


def _replica_form(fleet, name, shares) -> dict:
    form = {
        "name": name,
        "base_url": f"http://10.0.0.1/{name}",
        "model": fleet["model"].pk,
        "pool": fleet["shared"].pk,
        "engine": "vllm",
        "role": "both",
        "status": "up",
        "max_inflight": 64,
        "concurrency": "adaptive",
        "last_error": "",
        "gpu_shares-TOTAL_FORMS": len(shares),
        "gpu_shares-INITIAL_FORMS": 0,
        "gpu_shares-MIN_NUM_FORMS": 0,
        "gpu_shares-MAX_NUM_FORMS": 1000,
    }
    for n, share in enumerate(shares):
        for key, value in share.items():
            form[f"gpu_shares-{n}-{key}"] = value
    return form


def test_the_admin_checks_shares_against_the_gpus_others_and_writes_through_the_service(
    finance, fleet
):
    gpu = fleet["a100"].pk
    mig = {"gpu": gpu, "sharing": "mig", "mig_profile": "4g.40gb"}
    assert _post(finance, fleet, "r0", [{**mig, "mig_instance": 1}]).status_code == 201
    mig["share_percent"] = ""  # as the admin's form sends an empty field
    client = _admin_client()
    clash = client.post(
        "/admin/serving/replica/add/", _replica_form(fleet, "r1", [{**mig, "mig_instance": 2}])
    )
    assert clash.status_code == 200  # the form again, with the error
    assert "mig_profile: the MIG instances of GPU" in clash.content.decode()
    assert not Replica.objects.filter(name="r1").exists()

    three = {**mig, "mig_profile": "3g.40gb", "mig_instance": 2}
    made = client.post("/admin/serving/replica/add/", _replica_form(fleet, "r1", [three]))
    assert made.status_code == 302
    assert sorted(ReplicaGpu.objects.values_list("replica__name", "units")) == [
        ("r0", 400),
        ("r1", 300),
    ]


def test_a_disaggregated_pool_takes_prefill_and_decode_replicas_only(finance, fleet):
    made = finance.post(
        "/api/v1/fleet/pools", {"name": "split", "kind": "shared", "disaggregated": True},
        format="json",
    )  # fmt: skip
    assert made.status_code == 201, made.content
    split = made.json()["id"]
    body = {
        "name": "p1",
        "base_url": "http://10.0.0.1/p1",
        "model": fleet["model"].pk,
        "pool": split,
        "gpus": [fleet["a100"].pk],
    }
    refused = finance.post("/api/v1/fleet/replicas", body, format="json")  # role: both
    assert refused.status_code == 400
    assert refused.json()["error"]["field"] == "role"
    assert "is disaggregated" in refused.json()["error"]["message"]
    ok = finance.post("/api/v1/fleet/replicas", body | {"role": "prefill"}, format="json")
    assert ok.status_code == 201, ok.content
    misplaced = finance.post(
        "/api/v1/fleet/replicas",
        body | {"name": "d1", "role": "decode", "pool": fleet["shared"].pk, "gpus": []},
        format="json",
    )
    assert misplaced.status_code == 400 and misplaced.json()["error"]["field"] == "role"
    undo = finance.patch(f"/api/v1/fleet/pools/{split}", {"disaggregated": False}, format="json")
    assert undo.status_code == 400 and undo.json()["error"]["field"] == "disaggregated"
    assert sorted(Replica.objects.values_list("name", "role")) == [("p1", "prefill")]
