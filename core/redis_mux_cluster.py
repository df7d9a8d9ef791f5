"""The shared-connection Redis client (core.redis_mux) over a Redis
Cluster: one MuxRedis per master, each call sent to the master of its
keys' slot (a call's keys share a hash tag: a tenant's, the fair queue's),
the slot map read with CLUSTER SLOTS and read again whenever a node says
MOVED, the cluster is down, or a connection is lost.

Failover. Redis replicates asynchronously: a master can acknowledge a
write and die before its replica has it, and the replica promoted in its
place never saw it. For a spend account that would be a settlement lost,
so a tenant's spend would read low and the next requests could pass its
limit. So each write is followed, on the same connection, by WAIT for
`wait_replicas` replicas (Redis's own synchronous-replication command): a
write is acknowledged to the caller only once a replica holds it too. A
write not confirmed in time (its master died, or is cut off) is sent
again to whichever master serves the slot after the failover. (A master
with no replica left, its own promoted away or dead, has none to wait for:
no failover could lose its writes, its slots would just be down.) WAIT
holds the connection all callers share, so it waits briefly. Sent twice,
a spend script can only count a charge or a reservation twice (a tenant
refused early until the next correction), never lose one or give budget
back twice: the one script that gives back (a slice's draw) carries its
own id and is done once (billing.spend.accounts).

ASK (a slot migrating between masters while it is resharded) is waited
out as a failover is, the map read again: reshard with the gateways'
traffic low, or expect refusals for the slots moving.

URL: redis+cluster://host:port,host:port (any of the nodes; the rest are
found from them)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from core.redis_mux import MuxRedis, RedisReplyError, Script

logger = logging.getLogger(__name__)

CLUSTER_SCHEME = "redis+cluster://"
SLOTS = 16384
FAILOVER_SECONDS = 10.0  # a failover takes the cluster's node timeout and an election
RETRY_SECONDS = 0.1
RETRY_MAX_SECONDS = 1.0
WAIT_MS = 100  # WAIT blocks the connection every caller shares: never long
ALONE_SECONDS = 5.0  # a master found without replicas is asked again after this


class ReplicationUnconfirmed(ConnectionError):
    """A write's master did not have a replica confirm it in time."""


def cluster_url(url: str) -> bool:
    return url.startswith(CLUSTER_SCHEME)


def cluster_seeds(url: str) -> list[tuple[str, int]]:
    seeds = []
    for part in url[len(CLUSTER_SCHEME) :].strip("/").split(","):
        host, _, port = part.strip().rpartition(":")
        seeds.append((host or "127.0.0.1", int(port or 6379)))
    return seeds


class MuxRedisCluster:
    def __init__(
        self,
        url: str,
        *,
        wait_replicas: int = 1,
        wait_ms: int = WAIT_MS,
        failover_seconds: float = FAILOVER_SECONDS,
    ) -> None:
        self._seeds = cluster_seeds(url)
        self._nodes: dict[tuple[str, int], MuxRedis] = {}
        self._table: list[tuple[str, int]] | None = None
        self._refreshing: asyncio.Future | None = None
        self.wait_replicas = wait_replicas
        self.wait_ms = wait_ms
        self.failover_seconds = failover_seconds
        self._alone: dict[tuple[str, int], float] = {}  # master -> until (no replicas)
        self.redirects = 0  # MOVED and failovers met (how often the map was read again)

    def _node(self, address: tuple[str, int]) -> MuxRedis:
        node = self._nodes.get(address)
        if node is None:
            node = self._nodes[address] = MuxRedis(f"redis://{address[0]}:{address[1]}")
        return node

    async def _slot_table(self) -> list[tuple[str, int]]:
        if self._table is not None:
            return self._table
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._read_slots())
        try:
            return await asyncio.shield(self._refreshing)
        finally:
            if self._refreshing is not None and self._refreshing.done():
                self._refreshing = None

    async def _read_slots(self) -> list[tuple[str, int]]:
        last: Exception | None = None
        for address in [*self._nodes, *self._seeds]:
            try:
                spans = await self._node(address).command("CLUSTER", "SLOTS")
            except (ConnectionError, OSError, TimeoutError, RedisReplyError) as exc:
                last = exc
                continue
            table: list[tuple[str, int] | None] = [None] * SLOTS
            for low, high, master, *_replicas in spans:
                host = master[0].decode() if isinstance(master[0], bytes) else master[0]
                for slot in range(low, high + 1):
                    table[slot] = (host or address[0], int(master[1]))
            if None in table:  # a slot without a master: the cluster is failing over
                last = ConnectionError("redis cluster: a slot has no master yet")
                continue
            self._table = table
            return table
        raise ConnectionError(f"redis cluster: no node gave its slots ({last})")

    async def run_script(self, script: Script, keys: Sequence, args: Sequence, *, write=True):
        """`script` on the master of `keys`' slot; a write confirmed by
        `wait_replicas` replicas. Tried again through a failover (a
        master's replica promoted) until `failover_seconds` have passed;
        then the last error."""
        from redis.crc import key_slot

        slot = key_slot(str(keys[0]).encode())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.failover_seconds
        delay = RETRY_SECONDS
        while True:
            try:
                table = await self._slot_table()
                address = table[slot]
                node = self._node(address)
                result = await node.run_script(script, keys, args)
                if write and self.wait_replicas:
                    await self._confirmed(address, node, slot)
                return result
            except RedisReplyError as exc:
                said = str(exc)
                if not said.startswith(("MOVED", "ASK", "CLUSTERDOWN", "TRYAGAIN", "READONLY")):
                    raise
                error: Exception = exc
            except (ConnectionError, OSError, TimeoutError) as exc:
                error = exc
            self._table = None
            self.redirects += 1
            if loop.time() + delay > deadline:
                raise error
            await asyncio.sleep(delay)
            delay = min(RETRY_MAX_SECONDS, delay * 2)

    async def _confirmed(self, address: tuple[str, int], node: MuxRedis, slot: int) -> None:
        """The write just sent on `node` is on `wait_replicas` replicas, or
        the master has none to wait for (its replica was promoted away or
        died: no failover could then lose the write, the slot would be
        down). WAIT holds the shared connection, so its timeout is short."""
        loop = asyncio.get_running_loop()
        if self._alone.get(address, 0.0) > loop.time():
            return
        acked = int(await node.command("WAIT", self.wait_replicas, self.wait_ms))
        if acked >= self.wait_replicas:
            return
        role = await node.command("ROLE")
        if role and role[0] in (b"master", "master") and not role[2]:
            self._alone[address] = loop.time() + ALONE_SECONDS
            return
        raise ReplicationUnconfirmed(
            f"redis cluster: slot {slot}'s write confirmed by {acked} replicas"
        )

    async def command(self, *args):
        """A command to the master of its key's slot (the argument after
        the command's name: ZREM key member, ...); one without arguments
        (PING) to any master. A MOVED answer reads the slot map again."""
        from redis.crc import key_slot

        slot = key_slot(str(args[1]).encode()) if len(args) > 1 else 0
        for attempt in range(2):
            table = await self._slot_table()
            try:
                return await self._node(table[slot]).command(*args)
            except RedisReplyError as exc:
                if attempt or not str(exc).startswith(("MOVED", "ASK")):
                    raise
                self._table = None

    async def close(self) -> None:
        for node in self._nodes.values():
            await node.close()
        self._nodes.clear()


def mux_redis(url: str) -> MuxRedis | MuxRedisCluster:
    """The shared-connection client `url` names: one server, or a cluster."""
    return MuxRedisCluster(url) if cluster_url(url) else MuxRedis(url)
