"""Spend accounts held exactly under concurrency: an account is
a tenant's spend against a limit (what is left of its hard budget this
period, or its prepaid balance) with the reservations of its requests in
flight. Two implementations with one behaviour:

- LocalSpend: in-process, for a single gateway (no Redis configured).
- RedisSpend: one atomic Lua script per reservation, settlement or
  correction, so limits hold across every gateway process (over one
  shared connection per process, core.redis_mux).

**Reserve.** A request reserves its worst case on each of its tenant's
accounts at once: it is admitted only if, on every one, spent + reserved +
worst case <= limit, checked and recorded in one step (a tenant's accounts
share a Redis hash tag, so one script sees them all).

A reservation under a lease already held adds to it and moves its expiry
(a running request's GPU-second grant, renewed).

**Settle.** When it ends the reservations go and the actual charge is
added to spent, in the bucket of the hour the request was received in.

**Leases.** A reservation not settled within `ttl` seconds (its gateway
died, or the request outlived every timeout) expires and stops holding the
tenant's money. Its request, if it ran, reaches the ledger through the
record buffer or shows on reconciliation, and the next correction counts it.

**Seed and correction.** An account starts, on first use, from the seed its
first reservation brings (the ledger's spend so far). The ledger then
corrects it (`correct`): its spend of the usage received before a cut (an
hour boundary) replaces the account's count of that usage (the seed plus
the hours' buckets before the cut); later hours' buckets stay. Only a later
cut than the account's last applies, so applying one correction from every
gateway, or twice, changes nothing. A request received before the cut and
settled after it is added to the corrected base, since the ledger had not
seen it. What the correction replaced less the ledger is the drift.

Amounts are whole nano-units of the currency (1e-9), asked as ints
(`nanos`): a reservation's rounded up, so rounding never lets spend past
the limit, and a settlement's to the nearest. Redis's scripts compute in
doubles, exact to 2**53 nano-units (about 9 million in the currency); a
larger limit counts as that much."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from functools import cached_property

from core.calendar import epoch_hour
from core.nanos import from_nano, to_nano
from core.redis_mux import Script
from core.redis_mux_cluster import cluster_seeds, cluster_url, mux_redis

MAX_UNITS = 2**53 - 1
KEY_DAYS = 40  # an account outlives its period by this, for the correction job


def nanos(amount: Decimal, *, up: bool = False) -> int:
    """`amount` in whole nano-units (at most MAX_UNITS either way): rounded
    up for a reservation (`up`), to the nearest otherwise."""
    return max(-MAX_UNITS, min(MAX_UNITS, to_nano(amount, up=up)))


@dataclass(frozen=True)
class Limit:
    """One account a reservation must fit in: its key, its limit, and its
    spend by the ledger (used only if the account does not exist yet)."""

    key: str
    limit: Decimal
    seed: Decimal = Decimal(0)

    @cached_property
    def units(self) -> int:
        """The limit in nano-units, worked out once per terms (not per request)."""
        return nanos(self.limit)


@dataclass(frozen=True)
class SpendState:
    spent: Decimal
    reserved: Decimal


@dataclass(frozen=True)
class SpendRefused:
    """The reservation does not fit account `index` of those asked: what is
    left there (limit - spent - reserved, never below zero)."""

    index: int
    left: Decimal


@dataclass
class _Account:
    spent: int
    base: int  # the seed, or the last correction's ledger, plus late settlements
    cut: int  # epoch hour: settlements of requests received before it go to base
    reserved: int = 0
    hours: dict[int, int] = field(default_factory=dict)  # epoch hour -> settled
    # id -> (amount, expiry), in the order they expire
    leases: dict[str, tuple[int, float]] = field(
        default_factory=dict
    )  # ok-float: a lease's expiry, monotonic seconds


class LocalSpend:
    """One gateway process's spend accounts."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,  # ok-float: clocks
        wall: Callable[[], float] = time.time,  # ok-float: clocks
    ) -> None:
        self._accounts: dict[str, _Account] = {}
        self._clock = clock
        self._wall = wall

    def _account(self, key: str, seed: Decimal | None = None) -> _Account | None:
        account = self._accounts.get(key)
        if account is None:
            if seed is None:
                return None
            units = nanos(seed)
            account = _Account(spent=units, base=units, cut=epoch_hour(self._wall()))
            self._accounts[key] = account
        # Leases are kept in the order they expire (a renewal moves its
        # lease to the end; every lease a guard takes has the same ttl), so
        # the expired ones are at the front: a few looked at per call, not
        # every lease in flight. Were a shorter ttl to follow a longer one,
        # its lease would go when the one before it does: late, never early.
        now = self._clock()
        leases = account.leases
        while leases:
            lease_id = next(iter(leases))
            amount, expiry = leases[lease_id]
            if expiry > now:
                break
            del leases[lease_id]
            account.reserved -= amount
        return account

    async def reserve(
        self,
        limits: Sequence[Limit],
        lease_id: str,
        want: int,
        *,
        ttl: float,  # ok-float: seconds
    ) -> SpendRefused | None:
        """Hold `want` nano-units (a worst case rounded up: `nanos(..., up=True)`)
        on every account of `limits` if it fits under each, under
        `lease_id`: a lease already held grows by it (a running request's
        renewed GPU-second grant) and expires `ttl` from now."""
        accounts = []
        for index, limit in enumerate(limits):
            account = self._account(limit.key, limit.seed)
            left = limit.units - account.spent - account.reserved
            if want > left:
                return SpendRefused(index, from_nano(max(0, left)))
            accounts.append(account)
        expiry = self._clock() + ttl
        for account in accounts:
            held = account.leases.pop(lease_id, (0, 0.0))[0]
            account.leases[lease_id] = (held + want, expiry)
            account.reserved += want
        return None

    async def settle(self, keys: Sequence[str], lease_id: str, units: int, *, hour: int) -> None:
        """End the reservation (if it has not expired) and count `units`
        (the actual charge to the nearest nano-unit: `nanos(...)`) for a
        request received in epoch `hour`, on each account that exists."""
        for key in keys:
            account = self._account(key)
            if account is None:
                continue  # gone: its next use seeds it from the ledger, which has this
            lease = account.leases.pop(lease_id, None)
            if lease is not None:
                account.reserved -= lease[0]
            account.spent += units
            if hour < account.cut:
                account.base += units
            else:
                account.hours[hour] = account.hours.get(hour, 0) + units

    async def correct(self, key: str, *, cut: int, ledger: Decimal) -> Decimal | None:
        """The ledger's spend of usage received before epoch hour `cut`
        replaces the account's count of it; the drift (that count less the
        ledger), or None when the account is unknown or already corrected
        to `cut` or later."""
        account = self._account(key)
        if account is None or cut <= account.cut:
            return None
        before = account.base + sum(v for h, v in account.hours.items() if h < cut)
        account.hours = {h: v for h, v in account.hours.items() if h >= cut}
        account.base, account.cut = nanos(ledger), cut
        account.spent = account.base + sum(account.hours.values())
        return from_nano(before - account.base)

    async def state(self, key: str) -> SpendState | None:
        account = self._account(key)
        if account is None:
            return None
        return SpendState(spent=from_nano(account.spent), reserved=from_nano(account.reserved))

    async def close(self) -> None:
        """Nothing to let go of (the same interface as RedisSpend)."""


# Every script: KEYS come in threes per account (the account hash: spent,
# reserved, base, cut and the hours' buckets `h<epoch hour>`; the leases'
# expiries, a sorted set; the leases' amounts, a hash). Expired leases go
# first, on every call.
_COMMON_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function int(x) return string.format('%d', x) end
local function expire(acc, exp, leases)
  local gone = redis.call('ZRANGEBYSCORE', exp, '-inf', now)
  for _, id in ipairs(gone) do
    local amount = tonumber(redis.call('HGET', leases, id) or '0')
    redis.call('HINCRBY', acc, 'reserved', int(-amount))
    redis.call('HDEL', leases, id)
    redis.call('ZREM', exp, id)
  end
end
"""

# ARGV: want, ttl, lease id, key seconds, spare (what must stay left
# besides, for a slice), then (limit, seed) per account.
_RESERVE_LUA = (
    _COMMON_LUA
    + """
local want, ttl, id, keep = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local spare = tonumber(ARGV[5])
local n = #KEYS / 3
for i = 0, n - 1 do
  local acc = KEYS[3 * i + 1]
  if redis.call('HSETNX', acc, 'spent', ARGV[7 + 2 * i]) == 1 then
    redis.call('HSET', acc, 'base', ARGV[7 + 2 * i], 'cut', int(math.floor(now / 3600)))
  end
  expire(acc, KEYS[3 * i + 2], KEYS[3 * i + 3])
end
for i = 0, n - 1 do
  local acc = KEYS[3 * i + 1]
  local spent = tonumber(redis.call('HGET', acc, 'spent') or '0')
  local reserved = tonumber(redis.call('HGET', acc, 'reserved') or '0')
  local left = tonumber(ARGV[6 + 2 * i]) - spent - reserved
  if want + spare > left then
    return {0, i, int(left)}
  end
end
for i = 0, n - 1 do
  redis.call('ZADD', KEYS[3 * i + 2], now + ttl, id)
  redis.call('HINCRBY', KEYS[3 * i + 3], id, int(want))
  redis.call('HINCRBY', KEYS[3 * i + 1], 'reserved', int(want))
  for k = 1, 3 do redis.call('EXPIRE', KEYS[3 * i + k], keep) end
end
return {1, 0, 0}
"""
)

# ARGV: lease id, actual, epoch hour received, key seconds.
_SETTLE_LUA = (
    _COMMON_LUA
    + """
local id, actual, hour = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 0, #KEYS / 3 - 1 do
  local acc, exp, leases = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  if redis.call('EXISTS', acc) == 1 then
    expire(acc, exp, leases)
    local amount = redis.call('HGET', leases, id)
    if amount then
      redis.call('HINCRBY', acc, 'reserved', int(-tonumber(amount)))
      redis.call('HDEL', leases, id)
      redis.call('ZREM', exp, id)
    end
    redis.call('HINCRBY', acc, 'spent', int(actual))
    if hour < tonumber(redis.call('HGET', acc, 'cut') or '0') then
      redis.call('HINCRBY', acc, 'base', int(actual))
    else
      redis.call('HINCRBY', acc, 'h' .. int(hour), int(actual))
    end
    redis.call('EXPIRE', acc, tonumber(ARGV[4]))
  end
end
return 1
"""
)

# A slice (billing.spend.slices) gives back `release` unused and draws what
# its requests were charged, by hour received, from its lease: spent as a
# settlement is, the lease shrunk by both (never below nothing), its expiry
# moved. ARGV: lease id, release, ttl, key seconds, the draw's id, then
# (hour, actual) pairs; the last KEY holds the lease's last draw (its id
# and what it returned). Returns what the lease held before (0: it had
# expired). A draw sent again (its answer lost, or its master failed over
# after it ran) returns what it returned the first time and changes
# nothing: a release is never given back twice.
_SLICE_LUA = (
    _COMMON_LUA
    + """
local id, release, ttl, keep = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local op, last = ARGV[5], KEYS[#KEYS]
local done = redis.call('GET', last)
if done then
  local done_op, done_before = string.match(done, '^(%S+) (%d+)$')
  if done_op == op then return done_before end
end
local drawn = release
for j = 6, #ARGV, 2 do drawn = drawn + tonumber(ARGV[j + 1]) end
local before = 0
for i = 0, #KEYS / 3 - 1 do
  local acc, exp, leases = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  if redis.call('EXISTS', acc) == 1 then
    expire(acc, exp, leases)
    local held = tonumber(redis.call('HGET', leases, id) or '0')
    if i == 0 then before = held end
    local kept = math.max(0, held - drawn)
    redis.call('HINCRBY', acc, 'reserved', int(kept - held))
    if kept > 0 then
      redis.call('HSET', leases, id, int(kept))
      redis.call('ZADD', exp, now + ttl, id)
    else
      redis.call('HDEL', leases, id)
      redis.call('ZREM', exp, id)
    end
    local cut = tonumber(redis.call('HGET', acc, 'cut') or '0')
    for j = 6, #ARGV, 2 do
      local hour, actual = tonumber(ARGV[j]), tonumber(ARGV[j + 1])
      redis.call('HINCRBY', acc, 'spent', int(actual))
      if hour < cut then
        redis.call('HINCRBY', acc, 'base', int(actual))
      else
        redis.call('HINCRBY', acc, 'h' .. int(hour), int(actual))
      end
    end
    redis.call('EXPIRE', acc, keep)
  end
end
redis.call('SET', last, op .. ' ' .. int(before), 'EX', keep)
return int(before)
"""
)

# ARGV: cut (epoch hour), ledger. Returns nil, or what the ledger replaced.
_CORRECT_LUA = (
    _COMMON_LUA
    + """
local acc, cut, ledger = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('EXISTS', acc) == 0 then return false end
if cut <= tonumber(redis.call('HGET', acc, 'cut') or '0') then return false end
local before = tonumber(redis.call('HGET', acc, 'base') or '0')
local rest = 0
local fields = redis.call('HGETALL', acc)
for i = 1, #fields, 2 do
  local name = fields[i]
  if string.sub(name, 1, 1) == 'h' then
    local v = tonumber(fields[i + 1])
    if tonumber(string.sub(name, 2)) < cut then
      before = before + v
      redis.call('HDEL', acc, name)
    else
      rest = rest + v
    end
  end
end
redis.call('HSET', acc, 'base', int(ledger), 'cut', int(cut), 'spent', int(ledger + rest))
return int(before)
"""
)

_STATE_LUA = (
    _COMMON_LUA
    + """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
expire(KEYS[1], KEYS[2], KEYS[3])
return {redis.call('HGET', KEYS[1], 'spent') or '0', redis.call('HGET', KEYS[1], 'reserved') or '0'}
"""
)

_RESERVE, _SETTLE, _SLICE, _CORRECT, _STATE = map(
    Script, (_RESERVE_LUA, _SETTLE_LUA, _SLICE_LUA, _CORRECT_LUA, _STATE_LUA)
)


class RedisSpend:
    """Spend accounts shared by every gateway through Redis."""

    def __init__(self, url: str, *, prefix: str = "gw") -> None:
        self._redis = mux_redis(url)
        self._prefix = prefix
        self._key_seconds = KEY_DAYS * 86400
        self._key_cache: dict[str, list[str]] = {}
        self._limit_cache: dict[tuple[Limit, ...], tuple[list[str], list[int]]] = {}

    @staticmethod
    def keys_of(key: str, prefix: str) -> list[str]:
        # The tenant's part of the key is the hash tag: one Cluster slot per
        # tenant, so one script may hold all of a tenant's accounts.
        tenant, _, rest = key.partition(":")
        base = f"{prefix}:{{spend:{tenant}}}:{rest}"
        return [f"{base}:account", f"{base}:expiry", f"{base}:leases"]

    def _keys(self, key: str) -> list[str]:
        keys = self._key_cache.get(key)
        if keys is None:
            if len(self._key_cache) > 100_000:
                self._key_cache.clear()
            keys = self._key_cache[key] = self.keys_of(key, self._prefix)
        return keys

    def _limits(self, limits: Sequence[Limit]) -> tuple[list[str], list[int]]:
        """The keys and the (limit, seed) arguments of `limits`, made once
        per distinct limits (a tenant's terms), not per request."""
        limits = limits if isinstance(limits, tuple) else tuple(limits)
        found = self._limit_cache.get(limits)
        if found is None:
            keys, args = [], []
            for limit in limits:
                keys += self._keys(limit.key)
                args += [limit.units, nanos(limit.seed)]
            if len(self._limit_cache) > 10_000:
                self._limit_cache.clear()
            found = self._limit_cache[limits] = (keys, args)
        return found

    async def reserve(
        self,
        limits: Sequence[Limit],
        lease_id: str,
        want: int,
        *,
        ttl: float,  # ok-float: seconds
        spare: int = 0,
    ) -> SpendRefused | None:
        """As LocalSpend.reserve; `spare`: the nano-units that must stay
        left on each account besides (a slice is taken only far from the limit)."""
        keys, per_account = self._limits(limits)
        args = [want, ttl, lease_id, self._key_seconds, spare, *per_account]
        admitted, index, left = await self._redis.run_script(_RESERVE, keys, args)
        if admitted:
            return None
        return SpendRefused(int(index), from_nano(max(0, int(left))))

    async def settle(self, keys: Sequence[str], lease_id: str, units: int, *, hour: int) -> None:
        await self._redis.run_script(
            _SETTLE,
            [k for key in keys for k in self._keys(key)],
            [lease_id, units, hour, self._key_seconds],
        )

    async def slice_draw(
        self,
        limits: Sequence[Limit],
        lease_id: str,
        *,
        release: int,
        settled: dict[int, int],
        ttl: float,  # ok-float: seconds
        op: str,
    ) -> int:
        """A slice's lease gives back `release` nano-units and draws
        `settled` (epoch hour -> nano-units charged) into spent; returns
        what the lease held before (0: expired). `op` names the draw: sent
        again with the same `op` (after an error that left it unknown
        whether it ran), it is done once."""
        keys, _ = self._limits(limits)
        keys = [*keys, f"{keys[0].removesuffix(':account')}:draw:{lease_id}"]
        args = [lease_id, release, ttl, self._key_seconds, op]
        for hour, units in settled.items():
            args += [hour, units]
        return int(await self._redis.run_script(_SLICE, keys, args))

    async def correct(self, key: str, *, cut: int, ledger: Decimal) -> Decimal | None:
        units = nanos(ledger)
        before = await self._redis.run_script(_CORRECT, self._keys(key), [cut, units])
        return None if before is None else from_nano(int(before) - units)

    async def state(self, key: str) -> SpendState | None:
        found = await self._redis.run_script(_STATE, self._keys(key), [], write=False)
        if found is None:
            return None
        spent, reserved = found
        return SpendState(spent=from_nano(int(spent)), reserved=from_nano(int(reserved)))

    async def close(self) -> None:
        await self._redis.close()


def redis_spend_state(url: str, key: str, *, prefix: str = "gw") -> SpendState | None:
    """One account's state read from Redis without an event loop (the web
    pages and the correction job)."""
    import redis
    from redis.cluster import ClusterNode, RedisCluster

    if cluster_url(url):
        client = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in cluster_seeds(url)])
    else:
        client = redis.from_url(url)
    try:
        found = client.register_script(_STATE_LUA)(keys=RedisSpend.keys_of(key, prefix), args=[])
    finally:
        client.close()
    if found is None:
        return None
    spent, reserved = found
    return SpendState(spent=from_nano(int(spent)), reserved=from_nano(int(reserved)))
