"""Fair queuing across gateway processes: each process keeps its own
FairQueue (gateway/fairness.py) and, every `sync_seconds`, settles
two things with the others through Redis, each in one atomic Lua script.

Slots. A replica's `max_inflight` is a number of slots shared by the live
gateways. Each gateway holds some (a Redis hash per replica: slots held,
demand and last sync per gateway) and dispatches only into slots it holds,
so the slots granted at a replica never exceed `max_inflight` across all
gateways (exact: a gateway claims only free slots, atomically, and never
gives back one it may be using: a shrinking share is returned a round
later, once the smaller limit is in force in the process). Shares are
max-min fair on demand (requests outstanding there + requests waiting
that could run there): a gateway
wanting less than an equal split keeps all it wants, the rest is split
among the others; slots nobody wants are spread as slack so that a quiet
gateway starts a new request at once. With fewer slots than gateways
contending, the odd slots rotate every `ROTATE_SECONDS`. A gateway over
its share dispatches nothing more there and returns slots as they free.

Counters. Each tenant's virtual token counter (VTC) lives in one Redis hash:
every sync pushes this process's changes (charges, and the lifts that stop
an idle tenant hoarding credit) and reads back the shared values of the
tenants it has waiting.

What is approximate across processes (exact within one):
- which gateway gets a freed slot follows the shares above, not the global
  fair order: the least-served tenant waiting on another gateway waits for
  its gateway's share (at most about two sync periods to move a slot);
- counters are up to one sync period stale, and a tenant's "rejoins at the
  backlogged minimum" lift sees only the tenants waiting on its gateway;
- priority classes, the starvation bound, owner-first and the headroom
  apply within each gateway's share (a share under 16 slots keeps no
  headroom);
- a gateway that stops syncing (died, or stalled longer than
  `lease_seconds`) loses its slots to the others after the lease, so a
  stall that long can oversubscribe a replica until it syncs again.
When Redis is unreachable each gateway keeps the slots it holds and claims
no new ones until Redis is back."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping

from core.redis_clients import redis_async
from gateway.fairness import FairQueue

logger = logging.getLogger(__name__)

LEASE_SECONDS = 5.0
ROTATE_SECONDS = 0.5

_SLOTS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local me, lease = ARGV[1], tonumber(ARGV[2])
local epoch = math.floor(now / tonumber(ARGV[3]))
local out = {}
for i, key in ipairs(KEYS) do
  local base = 3 + (i - 1) * 3
  local cap = tonumber(ARGV[base + 1])
  local outstanding = tonumber(ARGV[base + 2])  -- slots it may be using now
  local held, want, seen = {}, {}, {}
  local raw = redis.call('HGETALL', key)
  for j = 1, #raw, 2 do
    local kind, gw = string.match(raw[j], '^(%a):(.+)$')
    local value = tonumber(raw[j + 1])
    if kind == 'h' then held[gw] = value
    elseif kind == 'd' then want[gw] = value
    elseif kind == 's' then seen[gw] = value end
  end
  local known = {}
  for gw, _ in pairs(held) do known[gw] = true end
  for gw, _ in pairs(seen) do known[gw] = true end
  for gw, _ in pairs(known) do
    if gw ~= me and (seen[gw] == nil or seen[gw] < now - lease) then
      redis.call('HDEL', key, 'h:' .. gw, 'd:' .. gw, 's:' .. gw)
      held[gw], seen[gw] = nil, nil
    end
  end
  seen[me] = now
  -- a slot in use here is held, whatever Redis remembers (a flushed Redis)
  held[me] = math.max(held[me] or 0, tonumber(ARGV[base + 2]))
  want[me] = tonumber(ARGV[base + 3])
  local live = {}
  for gw, _ in pairs(seen) do table.insert(live, gw) end
  table.sort(live)
  local n = #live
  local turn = {}
  for k, gw in ipairs(live) do turn[gw] = (k - 1 - epoch) % n end
  -- max-min fair shares of the demand; ties (and odd slots) rotate
  local order = {}
  for _, gw in ipairs(live) do table.insert(order, gw) end
  table.sort(order, function(a, b)
    local wa, wb = want[a] or 0, want[b] or 0
    if wa ~= wb then return wa < wb end
    return turn[a] > turn[b]
  end)
  local target, left = {}, cap
  for k, gw in ipairs(order) do
    local share = math.min(want[gw] or 0, math.floor(left / (n - k + 1)))
    target[gw] = share
    left = left - share
  end
  -- slots nobody wants: slack, spread evenly, odd ones in turn
  local each = math.floor(left / n)
  local extra = left - each * n
  for _, gw in ipairs(live) do
    target[gw] = target[gw] + each
    if turn[gw] < extra then target[gw] = target[gw] + 1 end
  end
  local taken = 0
  for _, gw in ipairs(live) do taken = taken + (held[gw] or 0) end
  local mine = held[me]
  local new
  if mine > target[me] then
    new = math.max(target[me], math.min(mine, outstanding))
  else
    new = math.min(target[me], mine + math.max(0, cap - taken))
  end
  redis.call('HSET', key, 'h:' .. me, new, 'd:' .. me, want[me], 's:' .. me,
    string.format('%.6f', now))
  redis.call('EXPIRE', key, math.ceil(lease * 4))
  table.insert(out, new)
  table.insert(out, math.min(new, target[me]))
end
return out
"""

_COUNTERS_LUA = """
local n = tonumber(ARGV[1])
for i = 0, n - 1 do
  local tenant, floor = ARGV[2 + i * 3], ARGV[3 + i * 3]
  local value = tonumber(redis.call('HGET', KEYS[1], tenant) or '0')
  if floor ~= '' then value = math.max(value, tonumber(floor)) end
  value = value + tonumber(ARGV[4 + i * 3])
  redis.call('HSET', KEYS[1], tenant, string.format('%.17g', value))
end
local out = {}
for j = 2 + n * 3, #ARGV do
  table.insert(out, redis.call('HGET', KEYS[1], ARGV[j]) or '0')
end
return out
"""


def gateway_id_new() -> str:
    """This process among the gateways: host, pid and a random part."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class FairQueueRedisShare:
    """Keeps one process's FairQueue in step with the other gateways'.
    The queue must be made with `track_service=True`."""

    def __init__(
        self,
        url: str,
        *,
        queue: FairQueue,
        prefix: str = "gw",
        gateway_id: str | None = None,
        lease_seconds: float = LEASE_SECONDS,  # ok-float
        rotate_seconds: float = ROTATE_SECONDS,  # ok-float
    ) -> None:
        self._redis = redis_async(url)
        self._slots = self._redis.register_script(_SLOTS_LUA)
        self._counters = self._redis.register_script(_COUNTERS_LUA)
        self.queue = queue
        self.gateway_id = gateway_id or gateway_id_new()
        self._prefix = prefix
        self._lease = lease_seconds
        self._rotate = rotate_seconds
        self._replicas: list[int] = []
        self._failing_since: float | None = None  # ok-float

    def _replica_key(self, replica_id: int) -> str:
        # One hash tag for every key: a script's keys share a Redis Cluster slot.
        return f"{self._prefix}:{{fq}}:replica:{replica_id}"

    @property
    def _counters_key(self) -> str:
        return f"{self._prefix}:{{fq}}:vtc"

    async def sync(
        self, max_inflight: Mapping[int, int], ceilings: Mapping[int, int] | None = None
    ) -> None:
        """One round: this process's share of each replica (replica id ->
        max_inflight, the whole fleet's; and the most each may take past it)
        and the shared counters."""
        try:
            await self._slots_sync(max_inflight, ceilings or {})
            await self._counters_sync()
        except Exception:
            now = time.monotonic()
            if self._failing_since is None:
                self._failing_since = now
                logger.exception("fair-queue sync with Redis failed; keeping the slots held")
            return
        if self._failing_since is not None:
            logger.warning(
                "fair-queue sync with Redis back after %.1fs",
                time.monotonic() - self._failing_since,
            )
            self._failing_since = None

    async def _slots_sync(
        self, max_inflight: Mapping[int, int], ceilings: Mapping[int, int]
    ) -> None:
        replicas = sorted(max_inflight)
        self._replicas = replicas
        if not replicas:
            self.queue.replicas_sync({})
            return
        outstanding = self.queue.outstanding_by_replica()
        waiting = self.queue.waiting_by_replica()
        usable = self.queue.slots_by_replica()
        args: list = [self.gateway_id, self._lease, self._rotate]
        for replica_id in replicas:
            busy = outstanding.get(replica_id, 0)
            # Held: every slot this process may dispatch into until it applies
            # the answer, not only those in use when sampled (it may fill the
            # rest while the script runs). A share that shrinks is given back
            # on the next round, once the smaller limit is in force here.
            held = max(busy, usable.get(replica_id, 0))
            args += [max_inflight[replica_id], held, busy + waiting.get(replica_id, 0)]
        result = await self._slots(keys=[self._replica_key(r) for r in replicas], args=args)
        capacity = {r: int(result[2 * i + 1]) for i, r in enumerate(replicas)}
        # Past N, this process's share of the ceiling in proportion to its share of N.
        share_of = {
            r: capacity[r] * ceilings[r] // max_inflight[r]
            for r in replicas
            if max_inflight[r] and ceilings.get(r, 0) > max_inflight[r]
        }
        self.queue.replicas_sync(capacity, share_of)

    async def _counters_sync(self) -> None:
        floors, deltas = self.queue.service_drain()
        changed = sorted(set(floors) | set(deltas))
        wanted = sorted(set(self.queue.tenants_waiting()) | set(changed))
        if not wanted:
            return
        args: list = [len(changed)]
        for tenant_id in changed:
            floor = floors.get(tenant_id)
            args += [
                tenant_id,
                "" if floor is None else repr(floor),
                repr(deltas.get(tenant_id, 0.0)),
            ]
        args += wanted
        try:
            values = await self._counters(keys=[self._counters_key], args=args)
        except BaseException:
            self.queue.service_restore(floors, deltas)  # pushed next time
            raise
        self.queue.service_merge(
            {t: float(v) for t, v in zip(wanted, values, strict=True)}  # ok-float
        )

    async def close(self) -> None:
        """Give back every slot held (the others may use them at once)."""
        try:
            for replica_id in self._replicas:
                key = self._replica_key(replica_id)
                me = self.gateway_id
                await self._redis.hdel(key, f"h:{me}", f"d:{me}", f"s:{me}")
        except Exception:
            logger.warning("could not give back fair-queue slots; they return after the lease")
        await self._redis.aclose()
