"""Reads of the fleet for platform staff: pools with their GPUs and
replicas counted, replicas with their GPUs, GPUs with where they sit, and
reservations."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Prefetch, Q, QuerySet

from serving.choices import ReplicaStatus
from serving.models import Gpu, Pool, Replica, Reservation


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
    return Replica.objects.select_related("pool", "model").prefetch_related(
        Prefetch("gpus", queryset=Gpu.objects.only("serial").order_by("serial"))
    )


def gpus_overview() -> list[Gpu]:
    """Every GPU with its SKU and node, and `pool` set to the pool of the
    lowest-numbered replica holding it (None: spare)."""
    gpus = list(Gpu.objects.select_related("sku", "node").order_by("node__name", "serial"))
    holder: dict[int, str] = {}
    for gpu_id, pool_name in Replica.gpus.through.objects.order_by("replica_id").values_list(
        "gpu_id", "replica__pool__name"
    ):
        holder.setdefault(gpu_id, pool_name)
    for gpu in gpus:
        gpu.pool_name = holder.get(gpu.pk)
    return gpus


def reservations_overview(*, now: datetime) -> list[Reservation]:
    rows = list(Reservation.objects.select_related("tenant", "pool").order_by("-end", "tenant"))
    for row in rows:
        row.active = row.start <= now < row.end
    return rows
