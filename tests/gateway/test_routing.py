"""Routing order: own capacity first, then shared, least loaded, skipping
saturated and suspect replicas; other tenants' capacity never."""

from gateway.fleet import FleetSnapshot, ReplicaInfo, Router
from serving.choices import PoolKind
from tests.gateway.replicas import replica


def router(*replicas: ReplicaInfo, holders=None) -> Router:
    r = Router(suspect_seconds=60)
    r.snapshot = FleetSnapshot(
        replicas_by_model={"m": list(replicas)}, reservation_holders=holders or {}
    )
    return r


def ids(replicas):
    return [r.id for r in replicas]


def test_own_dedicated_first_then_shared_and_never_anothers():
    r = router(
        replica(1, PoolKind.SHARED),
        replica(2, PoolKind.DEDICATED, owner=7),
        replica(3, PoolKind.DEDICATED, owner=8),
    )
    assert ids(r.candidates("m", 7)) == [2, 1]
    assert ids(r.candidates("m", 9)) == [1]
    assert ids(r.candidates("unknown", 7)) == []


def test_reservation_holder_uses_the_reserved_pool():
    reserved = replica(4, PoolKind.RESERVED, owner=7, pool=40)
    r = router(replica(1, PoolKind.SHARED), reserved, holders={40: frozenset({9})})
    assert ids(r.candidates("m", 9)) == [4, 1]  # holds a live reservation
    assert ids(r.candidates("m", 7)) == [4, 1]  # owns the pool
    assert ids(r.candidates("m", 5)) == [1]


def test_saturated_own_replica_spills_to_shared_but_stays_as_last_resort():
    own, shared = replica(2, PoolKind.DEDICATED, owner=7, max_inflight=1), replica(1, "shared")
    r = router(shared, own)
    r.acquire(own)
    assert ids(r.candidates("m", 7)) == [1, 2]
    for _ in range(3):
        r.acquire(shared)  # 3/2 in flight: more loaded than the own replica's 1/1
    assert ids(r.candidates("m", 7)) == [2, 1]  # all saturated: least loaded first
    r.release(own)
    assert ids(r.candidates("m", 7)) == [2, 1]


def test_least_loaded_among_equals_and_suspects_last():
    a, b = (
        replica(1, PoolKind.SHARED, max_inflight=10),
        replica(2, PoolKind.SHARED, max_inflight=10),
    )
    r = router(a, b)
    r.acquire(a)
    assert ids(r.candidates("m", 7)) == [2, 1]
    r.mark_suspect(b)
    assert ids(r.candidates("m", 7)) == [1, 2]  # a suspect: last resort
    r.mark_suspect(a)  # both: the one whose suspicion ends first
    assert ids(r.candidates("m", 7)) == [2, 1]
