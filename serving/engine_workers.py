"""Workers behind a frontend that routes to them itself (NVIDIA Dynamo's),
registered as replicas of their own from what the frontend lists, so that
GPUs, GPU-seconds and the ledger's rows are per worker while the gateway
routes to the frontend alone.

What the frontend's /health lists, and each worker's role, is read by
serving.engines.workers_listed (Dynamo's dialect).

A worker is named `<frontend>/<component>-<instance id in hex>`, in its
frontend's pool and model, with a fixed N (the frontend's own queue and
router place its requests). One the frontend no longer lists goes down;
listed again, up (a restarted worker gets a new instance id: a new row, its
GPUs to be moved by the operator).

    engine_workers_sync(frontend=, listed=) -> [Replica]   the frontend's workers
    engine_workers_refresh(frontend) -> [Replica] | None   from its /health
"""

from __future__ import annotations

import httpx
from django.db import transaction

from core.changes import fleet_changed
from serving.choices import Concurrency, Engine, ReplicaStatus
from serving.engines import Listed, workers_listed
from serving.models import Replica
from serving.services import replica_set_status

GONE = "no longer listed by its frontend's /health"


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
