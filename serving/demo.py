"""The demo fleet (used by `manage.py up`): one pool of each kind, the GPUs
behind them (owned, with a capex and a useful life, so their cost is real
arithmetic), and a reservation. Local vLLM replicas are registered into
these pools when they start. Idempotent."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal

from django.db import transaction

from serving.choices import PoolKind
from serving.models import Gpu, GpuSku, Node, Pool, Reservation
from tenants.models import Tenant

SINCE = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class DemoPool:
    name: str
    kind: str
    owner: str | None  # tenant slug
    gpus: int


DEMO_POOLS = [
    DemoPool("demo-shared", PoolKind.SHARED, None, 2),
    DemoPool("demo-reserved-globex", PoolKind.RESERVED, "globex", 1),
    DemoPool("demo-dedicated-acme", PoolKind.DEDICATED, "acme", 1),
]


@transaction.atomic
def fleet_demo_seed() -> dict[str, tuple[Pool, list[Gpu]]]:
    """pool name -> (pool, its GPUs)."""
    sku, _ = GpuSku.objects.get_or_create(
        name="H100 SXM 80GB (demo)",
        defaults={"power_idle_watts": 90, "power_busy_watts": 700, "memory_gb": 80},
    )
    node, _ = Node.objects.get_or_create(name="demo-node-1", defaults={"site": "demo-dc"})
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=["acme", "globex"])}
    out = {}
    for spec in DEMO_POOLS:
        owner = tenants.get(spec.owner) if spec.owner else None
        if spec.owner and owner is None:
            continue
        pool, _ = Pool.objects.get_or_create(
            name=spec.name, defaults={"kind": spec.kind, "owner": owner}
        )
        gpus = [
            Gpu.objects.get_or_create(
                serial=f"{spec.name}-gpu{n}",
                defaults={
                    "sku": sku,
                    "node": node,
                    "in_service_date": date(2025, 7, 1),
                    "capex": Decimal("28000"),
                    "useful_life_months": 48,
                    "salvage_value": Decimal("2800"),
                },
            )[0]
            for n in range(spec.gpus)
        ]
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
        out[spec.name] = (pool, gpus)
    return out
