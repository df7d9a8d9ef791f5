"""Writes to the fleet: registering replicas, pools and models, status."""

from __future__ import annotations

from datetime import date
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from serving.choices import IdleCostPolicy, PoolKind, ReplicaStatus
from serving.model_config import roofline_bytes
from serving.models import Gpu, GpuSku, Node, Pool, Replica, ServedModel
from tenants.models import Tenant

LOCAL_NODE = "localhost"
LOCAL_SKU = "vLLM CPU slot (dev)"


def served_model_ensure(
    *,
    name: str,
    chars_per_token: Decimal = Decimal(4),
    max_context_tokens: int = 4096,
    config: dict | None = None,
) -> ServedModel:
    """Create or update a served model; `config` (its Hugging Face
    config.json) gives the byte counts roofline attribution weighs by."""
    defaults = {"chars_per_token": chars_per_token, "max_context_tokens": max_context_tokens}
    if config is not None:
        defaults["weight_bytes"], defaults["kv_bytes_per_token"] = roofline_bytes(config)
    model, _ = ServedModel.objects.update_or_create(name=name, defaults=defaults)
    return model


def pool_ensure(
    *,
    name: str,
    kind: str = PoolKind.SHARED,
    owner: Tenant | None = None,
    idle_cost_policy: str = IdleCostPolicy.SPREAD,
) -> Pool:
    pool, _ = Pool.objects.get_or_create(
        name=name, defaults={"kind": kind, "owner": owner, "idle_cost_policy": idle_cost_policy}
    )
    return pool


def local_gpu_ensure(*, serial: str) -> Gpu:
    """A stand-in 'GPU' for a replica on this machine's CPU, so that local
    replicas have device-seconds and a (small, leased) hourly cost."""
    sku, _ = GpuSku.objects.get_or_create(
        name=LOCAL_SKU, defaults={"power_idle_watts": 30, "power_busy_watts": 65, "memory_gb": 1}
    )
    node, _ = Node.objects.get_or_create(name=LOCAL_NODE, defaults={"site": "this machine"})
    gpu, _ = Gpu.objects.get_or_create(
        serial=serial,
        defaults={
            "sku": sku,
            "node": node,
            "in_service_date": date.today(),
            "lease_rate_per_hour": Decimal("0.50"),
        },
    )
    return gpu


@transaction.atomic
def replica_register(
    *,
    name: str,
    base_url: str,
    model: ServedModel,
    pool: Pool,
    gpus: list[Gpu],
    launched_pid: int | None = None,
    max_inflight: int = 64,
) -> Replica:
    """Create or update a replica by name; it starts as up."""
    replica, _ = Replica.objects.update_or_create(
        name=name,
        defaults={
            "base_url": base_url,
            "model": model,
            "pool": pool,
            "launched_pid": launched_pid,
            "max_inflight": max_inflight,
            "status": ReplicaStatus.UP,
            "last_error": "",
        },
    )
    replica.gpus.set(gpus)
    return replica


def replica_set_status(*, replica: Replica, status: str, error: str = "") -> Replica:
    fields = {"status": status, "last_error": error[:500]}
    if status == ReplicaStatus.UP:
        fields["last_seen_at"] = timezone.now()
    Replica.objects.filter(pk=replica.pk).update(**fields)
    for key, value in fields.items():
        setattr(replica, key, value)
    return replica
