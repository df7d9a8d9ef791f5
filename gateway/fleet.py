"""What the gateway knows about the fleet: a snapshot of models, adapters,
replicas, pools and reservations, reloaded from the database every few
seconds; the gateway's own in-flight count per replica; and routing.

Routing: a tenant's own capacity first (dedicated pools it owns, reserved
pools it owns or holds a live reservation in), then the shared pool; the
least-loaded replica below its max_inflight within the first group that has
one; when all are saturated, the least-loaded overall (vLLM queues it).
A replica that just failed is skipped for a few seconds; one this gateway's
health checks find down (gateway/health_checks.py) is not routed to at all,
and with every candidate down the request is answered 503 `no_replica`."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

from django.db.models import Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from serving.choices import Concurrency, Engine, ModelTask, PoolKind, ReplicaRole, ReplicaStatus
from serving.gpu_shares import GPU_UNITS


@dataclass(frozen=True)
class ReplicaInfo:
    id: int
    name: str
    base_url: str
    model: str
    pool_id: int
    pool_kind: str
    pool_owner_id: int | None
    max_inflight: int
    engine: str = "vllm"  # serving.choices.Engine: how its answers are read (serving.engines)
    role: str = ReplicaRole.BOTH  # prefill or decode in a disaggregated pool (gateway.disagg)
    # The GPUs it runs on (a MIG instance or a time-sliced share is a
    # fraction of one): what a second of it bills in GPU-seconds.
    gpus: float = 0.0  # ok-float: GPU units / GPU_UNITS, a multiplier of seconds
    # Its N found by the gateway from its step time (gateway.adaptive), up to
    # max_inflight; else max_inflight itself.
    adaptive: bool = False
    # The inter-token p95 its tenants are promised (billing's SLO policies,
    # ms; None: none): how slow the adaptive N may let a step get.
    itl_promise_ms: float | None = None  # ok-float: a latency bound, never billed
    # A worker behind a frontend (Dynamo's): the frontend's id, and the
    # engine's own id for it that the frontend's answers name.
    front_id: int | None = None
    engine_instance: str = ""


@dataclass(frozen=True)
class AdapterInfo:
    name: str
    tenant_id: int
    base_model: str
    upstream_name: str


@dataclass(frozen=True)
class ModelInfo:
    name: str
    chars_per_token: float  # ok-float: an admission estimate, never billed
    max_context_tokens: int
    task: str = ModelTask.GENERATE  # which endpoints can serve it (gateway.payload)


@dataclass
class FleetSnapshot:
    models: dict[str, ModelInfo] = field(default_factory=dict)
    adapters: dict[str, AdapterInfo] = field(default_factory=dict)
    replicas_by_model: dict[str, list[ReplicaInfo]] = field(default_factory=dict)
    # Every replica not draining, up or down in the database (the health
    # checks' targets: a replica down comes back when it answers again),
    # and the ids of those down there.
    health_targets: list[ReplicaInfo] = field(default_factory=list)
    down_ids: frozenset[int] = frozenset()
    reservation_holders: dict[int, frozenset[int]] = field(default_factory=dict)
    # Workers behind a frontend, by (frontend id, engine instance): never
    # routed to or checked, only named in the rows of what they served.
    workers: dict[tuple[int, str], ReplicaInfo] = field(default_factory=dict)
    loaded_at: float = 0.0  # epoch seconds
    # When a reservation next starts or ends (epoch seconds; None: none
    # will): the holders above change then, with no row written.
    changes_at: float | None = None


def fleet_snapshot_load() -> FleetSnapshot:
    """From the database (sync: gateway.orm runs it)."""
    from billing.sla.policies import itl_promises
    from serving.models import LoraAdapter, Replica, Reservation, ServedModel

    now = timezone.now()
    snapshot = FleetSnapshot(loaded_at=time.time())
    for m in ServedModel.objects.all():
        snapshot.models[m.name] = ModelInfo(
            name=m.name,
            chars_per_token=float(m.chars_per_token),  # ok-float
            max_context_tokens=m.max_context_tokens,
            task=m.task,
        )
    for a in LoraAdapter.objects.select_related("base_model"):
        snapshot.adapters[a.name] = AdapterInfo(
            name=a.name,
            tenant_id=a.tenant_id,
            base_model=a.base_model.name,
            upstream_name=a.upstream_name,
        )
    replicas = list(
        Replica.objects.exclude(status=ReplicaStatus.DRAINING)
        .select_related("pool__owner", "model")
        .annotate(gpu_units=Coalesce(Sum("gpu_shares__units"), 0))
    )
    tightest, own = itl_promises(
        owners=list({r.pool.owner for r in replicas if r.pool.owner_id is not None}), moment=now
    )
    down = set()
    for r in replicas:
        promise = own[r.pool.owner_id] if r.pool.owner_id is not None else tightest
        info = ReplicaInfo(
            id=r.pk,
            name=r.name,
            base_url=r.base_url.rstrip("/"),
            model=r.model.name,
            pool_id=r.pool_id,
            pool_kind=r.pool.kind,
            pool_owner_id=r.pool.owner_id,
            max_inflight=r.max_inflight,
            engine=r.engine,
            role=r.role,
            gpus=r.gpu_units / GPU_UNITS,
            adaptive=r.concurrency == Concurrency.ADAPTIVE and r.engine == Engine.VLLM,
            itl_promise_ms=None if promise is None else float(promise),  # ok-float
            front_id=r.front_id,
            engine_instance=r.engine_instance,
        )
        if r.front_id is not None:
            snapshot.workers[(r.front_id, r.engine_instance)] = info
            continue
        snapshot.health_targets.append(info)
        if r.status == ReplicaStatus.UP:
            snapshot.replicas_by_model.setdefault(r.model.name, []).append(info)
        else:
            down.add(r.pk)
    snapshot.down_ids = frozenset(down)
    holders: dict[int, set[int]] = {}
    boundaries = []
    for pool_id, tenant_id, start, end in Reservation.objects.filter(end__gt=now).values_list(
        "pool_id", "tenant_id", "start", "end"
    ):
        if start <= now:
            holders.setdefault(pool_id, set()).add(tenant_id)
            boundaries.append(end)
        else:
            boundaries.append(start)
    snapshot.reservation_holders = {k: frozenset(v) for k, v in holders.items()}
    snapshot.changes_at = min(boundaries).timestamp() if boundaries else None
    return snapshot


class Router:
    def __init__(self, *, suspect_seconds: float) -> None:
        self.snapshot = FleetSnapshot()
        self.inflight: dict[int, int] = {}
        self._suspect_until: dict[int, float] = {}
        # Replicas this gateway's health checks find down (gateway/health_checks.py).
        self.down: set[int] = set()
        self._suspect_seconds = suspect_seconds
        # When each replica last answered a request (monotonic seconds).
        self._answered_at: dict[int, float] = {}

    def worker(self, front_id: int, instance: str) -> ReplicaInfo | None:
        """The worker behind a frontend that its answers name (Dynamo's)."""
        return self.snapshot.workers.get((front_id, instance))

    def is_own(self, replica: ReplicaInfo, tenant_id: int) -> bool:
        if replica.pool_kind == PoolKind.SHARED:
            return False
        return (
            replica.pool_owner_id == tenant_id
            or tenant_id in self.snapshot.reservation_holders.get(replica.pool_id, ())
        )

    def visible_replicas(self, model: str, tenant_id: int) -> list[ReplicaInfo]:
        return [
            r
            for r in self.snapshot.replicas_by_model.get(model, [])
            if r.pool_kind == PoolKind.SHARED or self.is_own(r, tenant_id)
        ]

    def gpus_at_most(self, model: str, tenant_id: int) -> float:
        """The most GPUs a replica that may serve the tenant's request has."""
        return max((r.gpus for r in self.visible_replicas(model, tenant_id)), default=0)

    def candidates(
        self, model: str, tenant_id: int, *, disaggregable: bool = True
    ) -> list[ReplicaInfo]:
        """Replicas to try first, best first; suspects (a recent connection
        failure) last, soonest cleared first: with every replica suspect a
        request still tries one rather than failing without an attempt (one
        dropped connection to the only replica would otherwise refuse
        everything for `suspect_seconds`). A request starts on a prefill
        replica of a disaggregated pool, never a decode one (its second
        hop: decode_candidates), and only if it can be split
        (`disaggregable`: a chat or text completion). A replica down never
        (none at all when every one is)."""
        now = time.monotonic()
        starts = {ReplicaRole.BOTH, ReplicaRole.PREFILL} if disaggregable else {ReplicaRole.BOTH}
        visible = [r for r in self.visible_replicas(model, tenant_id) if r.role in starts]
        if self.down:
            visible = [r for r in visible if r.id not in self.down]
        if len(visible) < 2:  # nothing to order (a model on one replica: the hot path)
            return visible
        usable = [r for r in visible if self._suspect_until.get(r.id, 0) <= now]
        suspects = sorted(
            (r for r in visible if self._suspect_until.get(r.id, 0) > now),
            key=lambda r: self._suspect_until[r.id],
        )
        own = [r for r in usable if self.is_own(r, tenant_id)]
        shared = [r for r in usable if r.pool_kind == PoolKind.SHARED]

        loads = {r.id: self.inflight.get(r.id, 0) / r.max_inflight for r in usable}
        ties = {r.id: random.random() for r in usable}  # noqa: S311 (spreading load, not secrets)

        def order(group: list[ReplicaInfo], *, saturated: bool) -> list[ReplicaInfo]:
            chosen = [r for r in group if (loads[r.id] >= 1) == saturated]
            return sorted(chosen, key=lambda r: (loads[r.id], ties[r.id]))

        ordered = order(own, saturated=False) + order(shared, saturated=False)
        ordered += order(own + shared, saturated=True)
        return ordered + suspects

    def decode_candidates(self, prefill: ReplicaInfo) -> list[ReplicaInfo]:
        """The decode replicas of a prefill replica's pool (and model) not
        down, least loaded first, suspects last."""
        now = time.monotonic()
        decoders = [
            r
            for r in self.snapshot.replicas_by_model.get(prefill.model, [])
            if r.pool_id == prefill.pool_id
            and r.role == ReplicaRole.DECODE
            and r.id not in self.down
        ]
        return sorted(
            decoders,
            key=lambda r: (
                self._suspect_until.get(r.id, 0) > now,
                self.inflight.get(r.id, 0) / r.max_inflight,
            ),
        )

    def acquire(self, replica: ReplicaInfo) -> None:
        self.inflight[replica.id] = self.inflight.get(replica.id, 0) + 1

    def release(self, replica: ReplicaInfo) -> None:
        self.inflight[replica.id] = max(0, self.inflight.get(replica.id, 0) - 1)

    def answered(self, replica: ReplicaInfo) -> None:
        """It answered a request: alive, however slow its health check."""
        self._answered_at[replica.id] = time.monotonic()

    def answered_within(self, replica_id: int, seconds: float) -> bool:
        return time.monotonic() - self._answered_at.get(replica_id, float("-inf")) <= seconds

    def mark_suspect(self, replica: ReplicaInfo) -> None:
        self._suspect_until[replica.id] = time.monotonic() + self._suspect_seconds

    def suspect_clear(self, replica_id: int) -> None:
        """Its health checks found it back up: no longer last in line."""
        self._suspect_until.pop(replica_id, None)
