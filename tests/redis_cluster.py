"""A Redis Cluster of the test's own (core.redis_cluster_local): three
masters and three replicas on loopback ports, never the machine's 6379."""

from __future__ import annotations

import pytest

from core.redis_cluster_local import RedisClusterLocal, redis_server_binary
from tests.services import require


@pytest.fixture
def redis_cluster(tmp_path):
    require(redis_server_binary() is not None, "redis-server is not installed (Debian: redis)")
    cluster = RedisClusterLocal(tmp_path / "redis-cluster").start()
    yield cluster
    cluster.stop()
