"""Redis clients for a process that serves many requests at once, for the
calls off a request's path (the fair queue's periodic sync; the calls on it
share one connection, core.redis_mux).

redis-py's default pool allows 100 connections and raises
MaxConnectionsError past them: under load (64 clients through one gateway,
each request running an admission script, a spend reservation and its
settlement, before the spend accounts moved to core.redis_mux) that
turned requests into 500s. Here a caller waits for a free
connection instead, for up to `WAIT_SECONDS`. redis-py's own
BlockingConnectionPool waits too, but takes a lock and a timeout on every
call (about 0.08 ms each on these machines, four calls per request); this
pool costs nothing until it is exhausted."""

from __future__ import annotations

import asyncio

MAX_CONNECTIONS = 256


def limits_redis_url() -> str:
    """Where the gateways' limits and spend accounts live: LIMITS_REDIS_URL
    (a server or a cluster), else REDIS_URL's server ("" without either)."""
    from django.conf import settings

    return settings.LIMITS_REDIS_URL or settings.REDIS_URL


WAIT_SECONDS = 5.0
POLL_SECONDS = 0.001


def redis_async(url: str):
    """An asyncio client whose callers wait for a connection when all
    `MAX_CONNECTIONS` are busy (its pool closed with the client)."""
    import redis.asyncio as redis
    from redis.exceptions import MaxConnectionsError

    class WaitingPool(redis.ConnectionPool):
        async def get_connection(self, *args, **kwargs):
            deadline = None
            while True:
                try:
                    return await super().get_connection(*args, **kwargs)
                except MaxConnectionsError:
                    now = asyncio.get_running_loop().time()
                    deadline = deadline or now + WAIT_SECONDS
                    if now >= deadline:
                        raise
                    await asyncio.sleep(POLL_SECONDS)

    from core.redis_mux_cluster import cluster_seeds, cluster_url

    if cluster_url(url):  # redis-py's own cluster client (its connections per node)
        from redis.asyncio.cluster import ClusterNode, RedisCluster

        nodes = [ClusterNode(host, port) for host, port in cluster_seeds(url)]
        return RedisCluster(startup_nodes=nodes, max_connections=MAX_CONNECTIONS)
    pool = WaitingPool.from_url(url, max_connections=MAX_CONNECTIONS)
    return redis.Redis.from_pool(pool)
