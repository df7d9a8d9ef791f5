"""Workers behind a frontend that routes to them itself (NVIDIA Dynamo's),
registered as replicas of their own from what the frontend lists, so that
GPUs, GPU-seconds and the ledger's rows are per worker while the gateway
routes to the frontend alone.

Dynamo's frontend lists on /health each worker's endpoints ("instances":
component, endpoint, instance_id, a 64-bit unsigned integer, kept as text).
A worker is an instance with a `generate` endpoint:
- component `prefill`: a disaggregated pair's prefill worker (role prefill);
- any other (`backend`): a decode worker where the frontend lists a prefill
  worker beside it, else an aggregated one (role both). The frontend's
  /metrics says the same per worker (`worker_type`); /health is the one
  listing every worker, idle ones too.

A worker is named `<frontend>/<component>-<instance id in hex>`, in its
frontend's pool and model, with a fixed N (the frontend's own queue and
router place its requests). One the frontend no longer lists goes down;
listed again, up (a restarted worker gets a new instance id: a new row, its
GPUs to be moved by the operator).

    workers_listed(health) -> [Listed]
    engine_workers_sync(frontend=, listed=) -> [Replica]   the frontend's workers
    engine_workers_refresh(frontend) -> [Replica] | None   from its /health
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import httpx
from django.db import transaction

from core.changes import fleet_changed
from serving.choices import Concurrency, Engine, ReplicaRole, ReplicaStatus
from serving.models import Replica
from serving.services import replica_set_status

GONE = "no longer listed by its frontend's /health"


@dataclass(frozen=True)
class Listed:
    instance: str  # the engine's id, as its answers name it (decimal text)
    component: str
    role: str


def workers_listed(health: Mapping[str, Any]) -> list[Listed]:
    """The workers a Dynamo frontend's /health lists (the module's docstring)."""
    found: dict[str, str] = {}
    for item in health.get("instances") or []:
        if not isinstance(item, dict) or item.get("endpoint") != "generate":
            continue
        instance = item.get("instance_id")
        if isinstance(instance, bool) or not isinstance(instance, int) or instance < 0:
            continue
        found[str(instance)] = str(item.get("component") or "backend")
    split = "prefill" in found.values()
    return [
        Listed(
            instance=instance,
            component=component,
            role=ReplicaRole.PREFILL
            if component == "prefill"
            else (ReplicaRole.DECODE if split else ReplicaRole.BOTH),
        )
        for instance, component in sorted(found.items())
    ]


def engine_workers_sync(*, frontend: Replica, listed: list[Listed]) -> list[Replica]:
    """Make the frontend's worker rows what it lists: new ones registered,
    roles followed, those gone down and those back up."""
    changed = False
    with transaction.atomic():
        known = {w.engine_instance: w for w in frontend.workers.select_for_update()}
        for item in listed:
            worker = known.get(item.instance)
            if worker is None:
                known[item.instance] = Replica.objects.create(
                    name=f"{frontend.name}/{item.component}-{int(item.instance):x}"[:100],
                    base_url=frontend.base_url,
                    engine=frontend.engine,
                    role=item.role,
                    model_id=frontend.model_id,
                    pool_id=frontend.pool_id,
                    max_inflight=frontend.max_inflight,
                    concurrency=Concurrency.FIXED,
                    front=frontend,
                    engine_instance=item.instance,
                )
                continue
            if worker.role != item.role:
                Replica.objects.filter(pk=worker.pk).update(role=item.role)
                worker.role, changed = item.role, True
            if worker.status == ReplicaStatus.DOWN:
                replica_set_status(replica=worker, status=ReplicaStatus.UP)
        listed_ids = {item.instance for item in listed}
        for instance, worker in known.items():
            if instance not in listed_ids and worker.status == ReplicaStatus.UP:
                replica_set_status(replica=worker, status=ReplicaStatus.DOWN, error=GONE)
    if changed:
        fleet_changed()
    return sorted(known.values(), key=lambda w: w.name)


def engine_workers_refresh(frontend: Replica, *, timeout: float = 3.0) -> list[Replica] | None:
    """A Dynamo frontend's workers, from its /health (None: it did not answer
    one, or is not a frontend with workers)."""
    if frontend.engine != Engine.DYNAMO or frontend.front_id is not None:
        return None
    try:
        response = httpx.get(f"{frontend.base_url.rstrip('/')}/health", timeout=timeout)
        response.raise_for_status()
        health = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    if not isinstance(health, dict):
        return None
    return engine_workers_sync(frontend=frontend, listed=workers_listed(health))
