"""The gateway reads its fleet again when told it changed (core.changes:
a replica registered, down, its pool or a reservation), not on a short
timer: a gateway whose periodic reload is ten minutes away still routes to
a replica registered a moment ago, and stops routing to one marked down;
a reservation starting or ending, which no row marks, is read at its time."""

from __future__ import annotations

import time
from datetime import timedelta

import openai
import pytest
from django.utils import timezone

from gateway.fleet import fleet_snapshot_load
from serving.choices import PoolKind, ReplicaStatus
from serving.models import Reservation
from serving.services import replica_set_status
from serving.tiny_model import MODEL_NAME
from tests.factories import make_tenant
from tests.fleet import (
    Fleet,
    GatewayUrl,
    fleet_done,
    fleet_model,
    gateway_worker,
    start_gateway,
    stop_gateway,
)
from tests.gateway.fake_upstream import FakeUpstream

HELLO = [{"role": "user", "content": "hello"}]


def _replicas_seen(url: GatewayUrl, expected: int, *, within: float) -> float:
    """Seconds until the gateway routes to `expected` replicas."""
    began = time.monotonic()
    while time.monotonic() - began < within:
        if gateway_worker(url)["replicas"] == expected:
            return time.monotonic() - began
        time.sleep(0.05)
    raise AssertionError(f"the gateway did not see {expected} replicas within {within} s")


@pytest.mark.slow
def test_a_replica_registered_or_marked_down_is_routed_at_once(transactional_db):
    fake = FakeUpstream().start()
    proc, url = start_gateway(env={"GATEWAY_FLEET_REFRESH_SECONDS": "600"})
    try:
        fleet = Fleet(gateway=url, model=fleet_model())
        fleet.add_tenant("a")
        _replicas_seen(url, 0, within=5)
        replica = fleet.add_replica("fake", fake.base_url, "shared")
        _replicas_seen(url, 1, within=5)  # told, not the reload ten minutes away
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0)
        assert client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2)
        replica_set_status(replica=replica, status=ReplicaStatus.DOWN, error="gone")
        _replicas_seen(url, 0, within=5)
        with pytest.raises(openai.APIStatusError) as refused:
            client.chat.completions.create(model=MODEL_NAME, messages=HELLO, max_tokens=2)
        assert refused.value.status_code in (404, 503)
        assert len(fake.requests) == 1  # nothing was sent to the replica down
        fleet_done(url)
    finally:
        stop_gateway(proc)
        fake.stop()


def test_the_snapshot_says_when_a_reservation_next_starts_or_ends(transactional_db):
    fleet_model()
    holder, later = make_tenant(name="holder"), make_tenant(name="later")
    from serving.services import pool_ensure

    pool = pool_ensure(name="reserved", kind=PoolKind.RESERVED, owner=holder)
    now = timezone.now()
    assert fleet_snapshot_load().changes_at is None  # no reservation: nothing to wait for
    Reservation.objects.create(
        tenant=holder, pool=pool, gpu_count=1, start=now - timedelta(days=1),
        end=now + timedelta(hours=5),
    )  # fmt: skip
    starts = now + timedelta(hours=2)
    Reservation.objects.create(
        tenant=later, pool=pool, gpu_count=1, start=starts, end=now + timedelta(days=3)
    )
    Reservation.objects.create(
        tenant=later,
        pool=pool,
        gpu_count=1,
        start=now - timedelta(days=9),
        end=now - timedelta(days=2),
    )  # fmt: skip  (over: changes nothing)
    snapshot = fleet_snapshot_load()
    assert snapshot.reservation_holders == {pool.pk: frozenset({holder.pk})}
    assert snapshot.changes_at == pytest.approx(starts.timestamp())


def test_the_fleet_is_read_again_when_a_reservation_starts_or_ends(settings):
    from gateway.fleet import FleetSnapshot
    from gateway.process import Gateway

    settings.GATEWAY = {**settings.GATEWAY, "FLEET_REFRESH_SECONDS": 30}
    gateway = Gateway()
    gateway.router.snapshot = FleetSnapshot(changes_at=None)
    assert gateway._fleet_next_read_in() == 30  # the fallback only
    gateway.router.snapshot = FleetSnapshot(changes_at=time.time() + 3)
    assert 2.5 < gateway._fleet_next_read_in() <= 3.05  # just after it starts
    gateway.router.snapshot = FleetSnapshot(changes_at=time.time() - 1)
    assert gateway._fleet_next_read_in() == pytest.approx(0.05)  # due: read at once


def test_a_fleet_that_cannot_be_read_is_tried_again_once_a_second(settings, monkeypatch):
    """The database away with a reservation boundary due: the kept snapshot
    says 'read now' every time, and the reads are paced, not a busy loop."""
    import asyncio

    from django.db import OperationalError

    import gateway.process as app
    from gateway.fleet import FleetSnapshot

    reads = []

    def unreadable():
        reads.append(time.monotonic())
        raise OperationalError("the database is away")

    monkeypatch.setattr(app, "fleet_snapshot_load", unreadable)
    settings.GATEWAY = {**settings.GATEWAY, "FLEET_REFRESH_SECONDS": 30}

    async def scenario():
        gateway = app.Gateway()
        gateway.router.snapshot = FleetSnapshot(changes_at=time.time() - 1)
        refresh = asyncio.create_task(gateway._refresh_fleet())
        await asyncio.sleep(1.5)
        refresh.cancel()

    asyncio.run(scenario())
    assert 1 <= len(reads) <= 2  # at 0.05 s, then a second later


def test_each_replica_carries_the_inter_token_promise_of_the_tenants_it_serves(db):
    """A shared pool's replicas keep the tightest inter-token p95 any policy
    promises (any tenant may run there); a dedicated pool's, its owner's
    own (its tier's here); an owner promised none, none. No policy with an
    inter-token target: no replica carries one."""
    from serving.services import local_gpu_ensure, pool_ensure, replica_register
    from tests.slo import slo_policy

    model = fleet_model()
    big = make_tenant(name="big", tier="dedicated")
    bare = make_tenant(name="bare", tier="reserved")
    pools = {
        "shared": pool_ensure(name="shared", kind=PoolKind.SHARED),
        "big": pool_ensure(name="big", kind=PoolKind.DEDICATED, owner=big),
        "bare": pool_ensure(name="bare", kind=PoolKind.DEDICATED, owner=bare),
    }
    for name, pool in pools.items():
        replica_register(
            name=name, base_url=f"http://127.0.0.1:9/{name}", model=model, pool=pool,
            gpus=[local_gpu_ensure(serial=f"gpu-{name}")],
        )  # fmt: skip

    def promises() -> dict[str, float | None]:
        return {r.name: r.itl_promise_ms for r in fleet_snapshot_load().health_targets}

    slo_policy(name="shared", tier="shared", itl=None)
    assert promises() == {"shared": None, "big": None, "bare": None}
    slo_policy(name="dedicated", tier="dedicated", itl="120")
    slo_policy(name="enterprise", plan=_plan(), itl="45.5")  # no tenant on it yet
    assert promises() == {"shared": 45.5, "big": 120.0, "bare": None}


def _plan():
    from billing.models import Plan

    return Plan.objects.create(name="enterprise", currency="USD")
