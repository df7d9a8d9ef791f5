"""Writes to the fleet: registering replicas, pools and models, status."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal

from django.db import transaction
from django.utils import timezone

from core.changes import fleet_changed
from core.errors import InputError
from serving.choices import (
    Engine,
    GpuSharing,
    IdleCostPolicy,
    ModelTask,
    PoolKind,
    ReplicaRole,
    ReplicaStatus,
)
from serving.gpu_shares import Share, ShareRefused, share_units, shares_check
from serving.model_config import roofline_bytes
from serving.models import (
    Gpu,
    GpuSku,
    Node,
    Pool,
    Replica,
    ReplicaGpu,
    ServedModel,
    role_misfit,
)
from tenants.models import Tenant
from webhooks.choices import EventType
from webhooks.services import event_emit

LOCAL_NODE = "localhost"
LOCAL_SKU = "vLLM CPU slot (dev)"


def served_model_ensure(
    *,
    name: str,
    chars_per_token: Decimal = Decimal(4),
    max_context_tokens: int = 4096,
    config: dict | None = None,
    task: str = ModelTask.GENERATE,
) -> ServedModel:
    """Create or update a served model; `config` (its Hugging Face
    config.json) gives the byte counts roofline attribution weighs by;
    `task` what its replicas run it for (serving.choices.ModelTask)."""
    defaults = {
        "chars_per_token": chars_per_token,
        "max_context_tokens": max_context_tokens,
        "task": task,
    }
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
    disaggregated: bool = False,
) -> Pool:
    pool, _ = Pool.objects.get_or_create(
        name=name,
        defaults={
            "kind": kind,
            "owner": owner,
            "idle_cost_policy": idle_cost_policy,
            "disaggregated": disaggregated,
        },
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
    gpus: list[Gpu | Share],
    launched_pid: int | None = None,
    max_inflight: int = 64,
    engine: str = Engine.VLLM,
    role: str = ReplicaRole.BOTH,
) -> Replica:
    """Create or update a replica by name; it starts as up. A role that does
    not fit the pool (serving.models.role_misfit) is an InputError."""
    problem = role_misfit(pool, role)
    if problem:
        raise InputError("role", problem)
    was = Replica.objects.filter(name=name).values_list("status", flat=True).first()
    since = {"status_since": timezone.now()} if was != ReplicaStatus.UP else {}
    replica, _ = Replica.objects.update_or_create(
        name=name,
        defaults={
            **since,
            "base_url": base_url,
            "model": model,
            "pool": pool,
            "launched_pid": launched_pid,
            "max_inflight": max_inflight,
            "engine": engine,
            "role": role,
            "status": ReplicaStatus.UP,
            "last_error": "",
        },
    )
    replica_gpu_shares_set(
        replica=replica, shares=[s if isinstance(s, Share) else Share(gpu_id=s.pk) for s in gpus]
    )
    return replica


@transaction.atomic
def replica_gpu_shares_set(*, replica: Replica, shares: list[Share]) -> list[ReplicaGpu]:
    """What `replica` holds of each GPU, replacing what it held: checked
    against every other replica's share of the same GPUs (InputError naming
    the field, nothing written), each share's units worked out here."""
    rows = replica_gpu_shares_checked(replica=replica, shares=shares, lock=True)
    ReplicaGpu.objects.filter(replica=replica).delete()
    created = ReplicaGpu.objects.bulk_create(rows)
    fleet_changed()  # bulk_create sends no signal
    return created


def replica_gpu_shares_checked(
    *, replica: Replica, shares: list[Share], lock: bool = False
) -> list[ReplicaGpu]:
    """The rows `replica_gpu_shares_set` would write (unsaved), or
    InputError: also what the admin's form checks before saving."""
    ids = [s.gpu_id for s in shares]
    if len(set(ids)) != len(ids):
        raise InputError("gpus", f"replica {replica.name} names a GPU more than once")
    gpus = Gpu.objects.select_related("sku")
    gpus = (gpus.select_for_update() if lock else gpus).in_bulk(ids)
    missing = sorted(set(ids) - set(gpus))
    if missing:
        raise InputError("gpus", f"no GPU with id {missing[0]}")
    others: dict[int, list[Share]] = {gpu_id: [] for gpu_id in ids}
    held = ReplicaGpu.objects.filter(gpu_id__in=ids).select_related("replica")
    for row in held.exclude(replica_id=replica.pk) if replica.pk else held:
        others[row.gpu_id].append(share_of(row))
    rows = []
    try:
        for asked in shares:
            share = Share(**{**asked.__dict__, "replica": replica.name, "pool_id": replica.pool_id})
            sku = gpus[share.gpu_id].sku
            shares_check(
                [*others[share.gpu_id], share], memory_gb=sku.memory_gb, mig_capable=sku.mig_capable
            )
            rows.append(
                ReplicaGpu(
                    replica=replica,
                    gpu_id=share.gpu_id,
                    sharing=share.sharing,
                    mig_profile=share.mig_profile if share.sharing == GpuSharing.MIG else "",
                    mig_instance=share.mig_instance if share.sharing == GpuSharing.MIG else None,
                    share_percent=(
                        share.share_percent if share.sharing == GpuSharing.TIME_SLICED else None
                    ),
                    units=share_units(share, memory_gb=sku.memory_gb, mig_capable=sku.mig_capable),
                )
            )
    except ShareRefused as refused:
        raise InputError(refused.field, refused.message) from None
    return rows


def share_of(row: ReplicaGpu) -> Share:
    return Share(
        gpu_id=row.gpu_id,
        sharing=row.sharing,
        mig_profile=row.mig_profile,
        mig_instance=row.mig_instance,
        share_percent=row.share_percent,
        replica=row.replica.name,
        pool_id=row.replica.pool_id,
    )


@transaction.atomic
def replica_set_status(*, replica: Replica, status: str, error: str = "") -> Replica:
    now = timezone.now()
    fields = {"status": status, "last_error": error[:500]}
    if status == ReplicaStatus.UP:
        fields["last_seen_at"] = now
    # Since when: only a change of status moves it (the scraper repeats "up").
    changed = Replica.objects.filter(pk=replica.pk).exclude(status=status)
    if changed.update(status_since=now):
        replica.status_since = now
        if status == ReplicaStatus.DOWN:
            replica_down_emit(replica_id=replica.pk, reason=error or "down", at=now)
    Replica.objects.filter(pk=replica.pk).update(**fields)
    if replica.status != status:  # the gateways route only to replicas up
        fleet_changed()
    for key, value in fields.items():
        setattr(replica, key, value)
    return replica


@transaction.atomic
def replica_health_record(*, replica_id: int, up: bool, reason: str, at: datetime) -> bool:
    """A health checker's verdict (a gateway's active checks, gateway/
    health_checks.py): the replica goes down, or back up, at `at` for
    `reason`. Written only where it changes the row, in one conditional
    UPDATE: every gateway checks on its own, and the second to find the
    same thing writes nothing (no notification, no new `status_since`). A
    draining replica is an operator's and stays so. True: this call
    changed it."""
    was, becomes = (
        (ReplicaStatus.DOWN, ReplicaStatus.UP) if up else (ReplicaStatus.UP, ReplicaStatus.DOWN)
    )
    fields = {"status": becomes, "status_since": at, "last_error": "" if up else reason[:500]}
    if up:
        fields["last_seen_at"] = at
    changed = Replica.objects.filter(pk=replica_id, status=was).update(**fields)
    if changed:
        fleet_changed()  # the gateways route only to replicas up
        if not up:
            replica_down_emit(replica_id=replica_id, reason=reason, at=at)
    return bool(changed)


def replica_down_emit(*, replica_id: int, reason: str, at: datetime) -> None:
    """`replica.down` for the operator's endpoints: once per going down."""
    replica = Replica.objects.select_related("pool").get(pk=replica_id)
    event_emit(
        type=EventType.REPLICA_DOWN,
        tenant=None,
        key=f"replica.down:{replica.pk}:{at.isoformat()}",
        summary=f"replica {replica.name} ({replica.pool.name}) down: {reason}"[:300],
        data={
            "replica": replica.name,
            "url": replica.base_url,
            "pool": replica.pool.name,
            "reason": reason,
            "since": at.isoformat(),
        },
    )


def replica_concurrency_record(*, limits: Mapping[int, int]) -> None:
    """What a gateway found of each adaptive replica's N (gateway.adaptive)."""
    now = timezone.now()
    for replica_id, n in limits.items():
        Replica.objects.filter(pk=replica_id).update(concurrency_limit=n, concurrency_limit_at=now)
