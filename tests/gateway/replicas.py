"""A replica as the gateway's router sees it, for routing and health tests."""

from gateway.fleet import ReplicaInfo
from serving.choices import PoolKind, ReplicaRole


def replica(
    rid: int,
    kind: str = PoolKind.SHARED,
    owner: int | None = None,
    pool: int | None = None,
    max_inflight: int = 2,
    role: str = ReplicaRole.BOTH,
) -> ReplicaInfo:
    return ReplicaInfo(
        id=rid,
        name=f"r{rid}",
        base_url=f"http://r{rid}",
        model="m",
        pool_id=pool or rid,
        pool_kind=kind,
        pool_owner_id=owner,
        max_inflight=max_inflight,
        role=role,
    )
