"""Reads of the fleet for platform staff: pools with their GPUs and
replicas counted, replicas with their GPUs, GPUs with where they sit, and
reservations, and
served models."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Prefetch, Q, QuerySet

from serving.choices import GpuSharing, ReplicaStatus
from serving.gpu_shares import GPU_UNITS
from serving.models import Gpu, Pool, Replica, ReplicaGpu, Reservation, ServedModel


def pools_overview() -> QuerySet[Pool]:
    return (
        Pool.objects.select_related("owner")
        .annotate(
            replicas_total=Count("replicas", distinct=True),
            replicas_up=Count(
                "replicas", filter=Q(replicas__status=ReplicaStatus.UP), distinct=True
            ),
            gpu_count=Count("replicas__gpus", distinct=True),
        )
        .order_by("kind", "name")
    )


def replicas_overview() -> QuerySet[Replica]:
    return Replica.objects.select_related("pool", "model", "front").prefetch_related(
        Prefetch(
            "gpu_shares",
            queryset=ReplicaGpu.objects.select_related("gpu").order_by("gpu__serial"),
        )
    )


def gpus_overview() -> list[Gpu]:
    """Every GPU with its SKU and node; `pool_name`, the pools of the
    replicas holding it (None: spare); `held`, who holds what of it (whole,
    MIG instances, time slices); `free`, what of a shared GPU nobody holds."""
    gpus = list(Gpu.objects.select_related("sku", "node").order_by("node__name", "serial"))
    shares: dict[int, list[ReplicaGpu]] = {}
    for row in ReplicaGpu.objects.select_related("replica__pool").order_by("replica_id"):
        shares.setdefault(row.gpu_id, []).append(row)
    for gpu in gpus:
        held = shares.get(gpu.pk, [])
        pools = list(dict.fromkeys(row.replica.pool.name for row in held))
        gpu.pool_name = ", ".join(pools) or None
        gpu.held = [f"{row.replica.name}: {row.describe()}" for row in held]
        left = GPU_UNITS - sum(row.units for row in held)
        gpu.free = ""
        if held and left > 0:
            kind = held[0].sharing
            gpu.free = (
                f"{left * 7 // GPU_UNITS} of 7 slices free"
                if kind == GpuSharing.MIG
                else f"{left * 100 // GPU_UNITS}% free"
            )
    return gpus


def reservations_overview(*, now: datetime) -> list[Reservation]:
    rows = list(Reservation.objects.select_related("tenant", "pool").order_by("-end", "tenant"))
    for row in rows:
        row.active = row.start <= now < row.end
    return rows


def served_model_get(*, name: str) -> ServedModel:
    """One served model by name (ServedModel.DoesNotExist if none)."""
    return ServedModel.objects.get(name=name)


def pool_gpus_held(*, name: str) -> float | None:
    """The GPUs a pool's replicas hold (shares in GPUs); None: no such pool."""
    pool = Pool.objects.filter(name=name).first()
    if pool is None:
        return None
    units = ReplicaGpu.objects.filter(replica__pool=pool).values_list("units", flat=True)
    return sum(units) / GPU_UNITS
