"""The demo fleet (used by `manage.py up`): one pool of each kind, the GPUs
behind them (owned, with a capex and a useful life, so their cost is real
arithmetic), a reservation, and one replica per pool of the tiny model,
registered as down until a local vLLM replica of that name starts (which
marks it up); beside them, in the shared pool on a GPU of its own, the
tiny model as an embedding model (tiny-embed), so /v1/embeddings can be
tried too; with `up --dynamo`, a shared pool served by NVIDIA Dynamo (its
frontend a replica, each mocker worker a replica of its own on a demo GPU).
Idempotent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import transaction

from serving.choices import Engine, IntensityPeriod, PoolKind, ReplicaStatus
from serving.engine_workers import engine_workers_refresh
from serving.gpu_shares import Share
from serving.models import Gpu, GpuSku, GridIntensity, Node, Pool, Replica, Reservation
from serving.services import replica_gpu_shares_set, replica_register, replica_set_status
from tenants.models import Tenant

SINCE = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class DemoPool:
    name: str
    kind: str
    owner: str | None  # tenant slug
    gpus: int
    replica: str


DEMO_POOLS = [
    DemoPool("demo-shared", PoolKind.SHARED, None, 2, "vllm-shared"),
    DemoPool("demo-reserved-globex", PoolKind.RESERVED, "globex", 1, "vllm-reserved-globex"),
    DemoPool("demo-dedicated-acme", PoolKind.DEDICATED, "acme", 1, "vllm-dedicated-acme"),
]
# The embedding replica: in the shared pool, on a GPU of its own.
DEMO_EMBED_POOL = "demo-shared"
DEMO_EMBED_REPLICA = "vllm-shared-embed"
DEMO_EMBED_GPU = "demo-shared-embed-gpu0"
# `up --dynamo`: a shared pool behind a Dynamo frontend.
DEMO_DYNAMO_POOL = "demo-dynamo"
DEMO_DYNAMO_FRONTEND = "dynamo-shared"


@dataclass(frozen=True)
class DemoPlacement:
    pool: Pool
    gpus: list[Gpu]
    replica: Replica


@transaction.atomic
def fleet_demo_seed() -> dict[str, DemoPlacement]:
    """pool name -> its pool, GPUs and replica."""
    from serving.local_replicas import tiny_model_served

    model = tiny_model_served()
    sku, node = _demo_sku_and_node()
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=["acme", "globex"])}
    out = {}
    for spec in DEMO_POOLS:
        owner = tenants.get(spec.owner) if spec.owner else None
        if spec.owner and owner is None:
            continue
        pool, _ = Pool.objects.get_or_create(
            name=spec.name, defaults={"kind": spec.kind, "owner": owner}
        )
        gpus = [_demo_gpu(f"{spec.name}-gpu{n}", sku, node) for n in range(spec.gpus)]
        if spec.kind == PoolKind.RESERVED:
            Reservation.objects.get_or_create(
                tenant=owner,
                pool=pool,
                defaults={
                    "gpu_count": spec.gpus,
                    "start": SINCE,
                    "end": datetime(2027, 1, 1, tzinfo=UTC),
                },
            )
        replica = _demo_replica(spec.replica, model=model, pool=pool, gpus=gpus)
        out[spec.name] = DemoPlacement(pool=pool, gpus=gpus, replica=replica)
    return out


@transaction.atomic
def embed_demo_seed() -> DemoPlacement | None:
    """The embedding replica (tiny-embed) in the shared pool, on its own
    GPU; None before the demo fleet (its shared pool) is seeded."""
    from serving.local_replicas import tiny_model_served

    pool = Pool.objects.filter(name=DEMO_EMBED_POOL).first()
    if pool is None:
        return None
    model = tiny_model_served(embed=True)
    gpus = [_demo_gpu(DEMO_EMBED_GPU, *_demo_sku_and_node())]
    replica = _demo_replica(DEMO_EMBED_REPLICA, model=model, pool=pool, gpus=gpus)
    return DemoPlacement(pool=pool, gpus=gpus, replica=replica)


# The demo site's grid: a year's average (gCO2e/kWh) for each year the
# demo's history and plan reach, marked as a demo figure.
DEMO_GRID = {"site": "demo-dc", "g_per_kwh": "290", "source": "demo: not a real grid's figure"}


def grid_intensity_demo_seed(*, years=range(2025, 2029)) -> int:
    created = 0
    for year in years:
        _, made = GridIntensity.objects.get_or_create(
            site=DEMO_GRID["site"],
            period=IntensityPeriod.YEAR,
            start=datetime(year, 1, 1, tzinfo=UTC),
            defaults={"g_per_kwh": Decimal(DEMO_GRID["g_per_kwh"]), "source": DEMO_GRID["source"]},
        )
        created += made
    return created


def _demo_sku_and_node() -> tuple[GpuSku, Node]:
    sku, _ = GpuSku.objects.get_or_create(
        name="H100 SXM 80GB (demo)",
        defaults={"power_idle_watts": 90, "power_busy_watts": 700, "memory_gb": 80},
    )
    node, _ = Node.objects.get_or_create(name="demo-node-1", defaults={"site": "demo-dc"})
    return sku, node


def _demo_gpu(serial: str, sku: GpuSku, node: Node) -> Gpu:
    return Gpu.objects.get_or_create(
        serial=serial,
        defaults={
            "sku": sku,
            "node": node,
            "in_service_date": date(2025, 7, 1),
            "capex": Decimal("28000"),
            "useful_life_months": 48,
            "salvage_value": Decimal("2800"),
        },
    )[0]


def _demo_replica(name: str, *, model, pool: Pool, gpus: list[Gpu]) -> Replica:
    """The replica as seeded: down until a local replica of that name starts."""
    replica = Replica.objects.filter(name=name).first()
    if replica is None:
        replica = replica_register(
            name=name,
            base_url="http://127.0.0.1:9",  # replaced when a local replica starts
            model=model,
            pool=pool,
            gpus=gpus,
        )
        replica_set_status(replica=replica, status=ReplicaStatus.DOWN)
    return replica


@transaction.atomic
def dynamo_demo_seed(*, base_url: str) -> Replica:
    """The Dynamo pool (shared) and its frontend at `base_url`, up, with no
    GPU of its own: the GPUs are its workers' (dynamo_workers_place)."""
    from serving.local_replicas import tiny_model_served

    pool, _ = Pool.objects.get_or_create(name=DEMO_DYNAMO_POOL, defaults={"kind": PoolKind.SHARED})
    return replica_register(
        name=DEMO_DYNAMO_FRONTEND,
        base_url=base_url,
        model=tiny_model_served(),
        pool=pool,
        gpus=[],
        engine=Engine.DYNAMO,
    )


def dynamo_workers_place(frontend: Replica) -> list[Replica]:
    """The workers the frontend lists, each on a demo GPU of its pool (one
    an earlier run's worker held is taken back from it: a restarted worker
    is a new one)."""
    workers = engine_workers_refresh(frontend) or []
    live = [w for w in workers if w.status == ReplicaStatus.UP]
    for gone in (w for w in workers if w.status != ReplicaStatus.UP):
        replica_gpu_shares_set(replica=gone, shares=[])
    sku, node = _demo_sku_and_node()
    for n, worker in enumerate(live):
        gpu = _demo_gpu(f"{DEMO_DYNAMO_POOL}-gpu{n}", sku, node)
        replica_gpu_shares_set(replica=worker, shares=[Share(gpu_id=gpu.pk)])
    return live
