"""`up --dynamo`: a shared pool served by NVIDIA Dynamo beside the vLLM
pools (its frontend and a simulated prefill and decode worker, started for
real), the frontend a replica with no GPU of its own and each worker a
replica on a demo GPU of the pool; run again, the new workers take the
GPUs back from the last run's, which are down."""

from __future__ import annotations

import pytest

from demo.seeds.fleet import DEMO_DYNAMO_FRONTEND, DEMO_DYNAMO_POOL
from demo.stack import dynamo_demo_start
from serving.choices import Engine, PoolKind, ReplicaStatus
from serving.models import Replica, ReplicaGpu

pytestmark = pytest.mark.django_db


def _started() -> tuple[Replica, list[Replica]]:
    deployment, workers = dynamo_demo_start(progress=lambda _message: None)
    deployment.stop()
    return Replica.objects.get(name=DEMO_DYNAMO_FRONTEND), workers


def test_a_dynamo_pool_with_each_worker_on_a_demo_gpu_and_again(dynamo_runtime):
    front, first = _started()
    assert (front.engine, front.pool.name, front.pool.kind) == (
        Engine.DYNAMO, DEMO_DYNAMO_POOL, PoolKind.SHARED,
    )  # fmt: skip
    assert not ReplicaGpu.objects.filter(replica=front).exists()
    assert sorted(w.role for w in first) == ["decode", "prefill"]
    held = {w.pk: list(ReplicaGpu.objects.filter(replica=w).values_list("gpu__serial", "units"))
            for w in first}  # fmt: skip
    assert sorted(serial for rows in held.values() for serial, _ in rows) == [
        f"{DEMO_DYNAMO_POOL}-gpu0", f"{DEMO_DYNAMO_POOL}-gpu1",
    ]  # fmt: skip
    assert all(len(rows) == 1 for rows in held.values())

    _, second = _started()  # a new deployment: new worker ids
    assert {w.pk for w in second}.isdisjoint(w.pk for w in first)
    for old in Replica.objects.filter(pk__in=[w.pk for w in first]):
        assert old.status == ReplicaStatus.DOWN
        assert not ReplicaGpu.objects.filter(replica=old).exists()
    assert ReplicaGpu.objects.filter(replica__in=second).count() == 2
