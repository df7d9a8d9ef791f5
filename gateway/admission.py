"""Admission: per-tenant max concurrency, in-flight tokens (prompt
estimate + max_tokens of every request in flight), requests/min and
tokens/min. Two implementations with the same semantics:

- LocalAdmission: in-process, for a single gateway (no Redis configured).
- RedisAdmission: one atomic Lua script per admission, so the limits hold
  across every gateway process (a per-process limit would be multiplied by
  the process count). In-flight entries are leases with an expiry, so a
  gateway that dies without releasing does not leak capacity forever.

Per-minute limits use a sliding window estimated from two fixed one-minute
buckets (the previous bucket weighted by the part of it still in the window).

A refusal for concurrency or in-flight tokens (`QUEUEABLE_LIMITS`) can end
when one of the tenant's requests does: `release_wait` returns then (at
once for a release in this process; for Redis, also after `poll_seconds`,
since another gateway's release is not signalled), and the gateway's queue
(gateway/queueing.py) tries again. Per-minute limits are not worth
waiting for: they refuse at once."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass

from core.redis_mux import Script
from core.redis_mux_cluster import mux_redis
from gateway.callers import Caller
from gateway.errors import Refused

UNAVAILABLE = "admission_unavailable"  # the shared store could not be reached: fail closed
LIMIT_MESSAGES = {
    "max_concurrent_requests": "too many concurrent requests (limit {limit})",
    "max_inflight_tokens": "too many tokens in flight (limit {limit})",
    "requests_per_minute": "requests per minute limit reached (limit {limit})",
    "tokens_per_minute": "tokens per minute limit reached (limit {limit})",
    UNAVAILABLE: "the gateway's admission limits could not be read (Redis): try again shortly",
}


logger = logging.getLogger(__name__)

QUEUEABLE_LIMITS = frozenset({"max_concurrent_requests", "max_inflight_tokens"})
POLL_SECONDS = 0.04


class ReleaseSignal:
    """Wakes whoever waits on a tenant's limits when one of its requests
    ends in this process. Releases are numbered per tenant, so a release
    between a refusal and the wait is not missed."""

    def __init__(self) -> None:
        self._count: dict[int, int] = {}
        self._released: dict[int, asyncio.Future] = {}

    def count(self, tenant_id: int) -> int:
        return self._count.get(tenant_id, 0)

    async def wait(self, tenant_id: int, since: int, timeout: float) -> None:  # ok-float
        if self.count(tenant_id) != since:
            return
        future = self._released.get(tenant_id)
        if future is None or future.done():
            future = asyncio.get_running_loop().create_future()
            self._released[tenant_id] = future
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(future), timeout)

    def notify(self, tenant_id: int) -> None:
        self._count[tenant_id] = self.count(tenant_id) + 1
        future = self._released.pop(tenant_id, None)
        if future is not None and not future.done():
            future.set_result(None)


@dataclass(frozen=True)
class Refusal:
    limit: str
    value: int
    retry_after: int
    status: int = 429

    @property
    def message(self) -> str:
        return LIMIT_MESSAGES[self.limit].format(limit=self.value)

    def refused(self, more: str = "") -> Refused:
        """The answer (waiting lifts it), `more` said after the limit."""
        return Refused(self.status, self.limit, self.message + more, retry_after=self.retry_after)


def _window_estimate(prev: float, cur: float, now: float) -> float:
    return prev * (1 - (now % 60) / 60) + cur


def _window_wait(prev: float, cur: float, need: float, limit: float, now: float) -> int:
    """Seconds until the sliding window (last minute's count weighed by the
    part of it still in the window, plus this minute's) has room for `need`
    more: later this minute if this minute's count leaves room once last
    minute's has slid out far enough, else into the next minute, where this
    minute's count is the one sliding out. (`_ACQUIRE_LUA` says the same.)"""
    into = now % 60
    if cur + need <= limit:  # room this minute once prev weighs little enough
        fraction = 1 - (limit - need - cur) / prev
        wait = 60 * fraction - into
    else:  # next minute, as this minute's count slides out
        fraction = 1 - (limit - need) / cur if cur else 0.0
        wait = 60 - into + 60 * max(0.0, fraction)
    return max(1, math.ceil(wait))


class LocalAdmission:
    def __init__(self) -> None:
        self._inflight: dict[int, dict[str, int]] = {}
        self._buckets: dict[int, dict[str, float]] = {}
        self._released = ReleaseSignal()

    async def acquire(self, caller: Caller, request_id: str, tokens: int) -> Refusal | None:
        limits = caller.limits
        now = time.time()
        leases = self._inflight.setdefault(caller.tenant_id, {})
        if limits.max_concurrent_requests and len(leases) + 1 > limits.max_concurrent_requests:
            return Refusal("max_concurrent_requests", limits.max_concurrent_requests, 1)
        if (
            limits.max_inflight_tokens
            and sum(leases.values()) + tokens > limits.max_inflight_tokens
        ):
            return Refusal("max_inflight_tokens", limits.max_inflight_tokens, 1)
        minute = int(now // 60)
        buckets = self._buckets.setdefault(caller.tenant_id, {})
        if len(buckets) > 4:  # more than this minute's and the last one's (r and t)
            for stale in [k for k in buckets if int(k[1:]) < minute - 1]:
                del buckets[stale]
        refusal = None  # the per-minute limit that keeps it waiting longest
        for limit, prefix, need in (
            ("requests_per_minute", "r", 1),
            ("tokens_per_minute", "t", tokens),
        ):
            allowed = getattr(limits, limit)
            prev, cur = buckets.get(f"{prefix}{minute - 1}", 0), buckets.get(f"{prefix}{minute}", 0)
            if allowed and _window_estimate(prev, cur, now) + need > allowed:
                wait = _window_wait(prev, cur, need, allowed, now)
                if refusal is None or wait > refusal.retry_after:
                    refusal = Refusal(limit, allowed, wait)
        if refusal is not None:
            return refusal
        buckets[f"r{minute}"] = buckets.get(f"r{minute}", 0) + 1
        buckets[f"t{minute}"] = buckets.get(f"t{minute}", 0) + tokens
        leases[request_id] = tokens
        return None

    async def release(self, caller: Caller, request_id: str) -> None:
        if self._inflight.get(caller.tenant_id, {}).pop(request_id, None) is not None:
            self._released.notify(caller.tenant_id)

    def releases(self, tenant_id: int) -> int:
        """How many of the tenant's requests have ended here (for `release_wait`)."""
        return self._released.count(tenant_id)

    async def release_wait(self, tenant_id: int, since: int, timeout: float) -> None:  # ok-float
        """Until one of the tenant's requests ends after `releases` was
        `since`, or `timeout` seconds."""
        await self._released.wait(tenant_id, since, timeout)

    async def close(self) -> None:
        return None


_ACQUIRE_LUA = """
local now = tonumber(ARGV[1])
local tokens = tonumber(ARGV[3])
local maxc, maxt = tonumber(ARGV[5]), tonumber(ARGV[6])
local rpm, tpm = tonumber(ARGV[7]), tonumber(ARGV[8])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if maxc > 0 or maxt > 0 then
  local members = redis.call('ZRANGE', KEYS[1], 0, -1)
  if maxc > 0 and #members + 1 > maxc then return {'max_concurrent_requests', maxc, 1} end
  if maxt > 0 then
    local sum = tokens
    for _, m in ipairs(members) do sum = sum + tonumber(string.match(m, ':(%d+)$')) end
    if sum > maxt then return {'max_inflight_tokens', maxt, 1} end
  end
end
local minute = math.floor(now / 60)
local into = now % 60
local keep = 1 - into / 60
-- Seconds until the window has room for `need` (admission._window_wait).
local function wait_for(prev, cur, need, limit)
  local wait
  if cur + need <= limit then
    wait = 60 * (1 - (limit - need - cur) / prev) - into
  else
    local fraction = 0
    if cur > 0 then fraction = math.max(0, 1 - (limit - need) / cur) end
    wait = 60 - into + 60 * fraction
  end
  return math.max(1, math.ceil(wait))
end
local checks = {{'requests_per_minute', 'r', 1, rpm}, {'tokens_per_minute', 't', tokens, tpm}}
local refused = nil  -- the per-minute limit that keeps it waiting longest
for _, c in ipairs(checks) do
  local name, prefix, need, limit = c[1], c[2], c[3], c[4]
  if limit > 0 then
    local cur = tonumber(redis.call('HGET', KEYS[2], prefix .. minute) or '0')
    local prev = tonumber(redis.call('HGET', KEYS[2], prefix .. (minute - 1)) or '0')
    if prev * keep + cur + need > limit then
      local wait = wait_for(prev, cur, need, limit)
      if refused == nil or wait > refused[3] then refused = {name, limit, wait} end
    end
  end
end
if refused ~= nil then return refused end
redis.call('HINCRBY', KEYS[2], 'r' .. minute, 1)
redis.call('HINCRBY', KEYS[2], 't' .. minute, tokens)
redis.call('HDEL', KEYS[2], 'r' .. (minute - 2), 't' .. (minute - 2))
redis.call('EXPIRE', KEYS[2], 180)
redis.call('ZADD', KEYS[1], ARGV[4], ARGV[2])
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[9]))
return {'', 0, 0}
"""


_ACQUIRE = Script(_ACQUIRE_LUA)


class RedisAdmission:
    def __init__(
        self,
        url: str,
        *,
        lease_seconds: float,
        prefix: str = "gw",
        poll_seconds: float = POLL_SECONDS,  # ok-float
    ) -> None:
        # The process's requests share one connection (core.redis_mux):
        # redis-py's client cost about 0.1 ms of CPU per call, two per request.
        self._redis = mux_redis(url)
        self._released = ReleaseSignal()
        self._poll_seconds = poll_seconds
        self._lease_seconds = lease_seconds
        self._prefix = prefix
        self._members: dict[str, tuple[int, str]] = {}

    def _keys(self, tenant_id: int) -> list[str]:
        # One hash tag per tenant: both keys land on the same Redis Cluster slot.
        return [
            f"{self._prefix}:{{t{tenant_id}}}:leases",
            f"{self._prefix}:{{t{tenant_id}}}:window",
        ]

    async def acquire(self, caller: Caller, request_id: str, tokens: int) -> Refusal | None:
        now = time.time()
        member = f"{request_id}:{tokens}"
        try:
            result = await self._acquire_script(caller, now, member, tokens)
        except Exception as exc:  # Redis unreachable: nothing admitted unchecked
            logger.warning("request %s: admission limits unreachable: %s", request_id, exc)
            return Refusal(UNAVAILABLE, 0, 1, status=503)
        limit = result[0].decode() if isinstance(result[0], bytes) else result[0]
        if limit:
            return Refusal(limit, int(result[1]), int(result[2]))
        self._members[request_id] = (caller.tenant_id, member)
        return None

    async def _acquire_script(self, caller: Caller, now: float, member: str, tokens: int):
        limits = caller.limits
        return await self._redis.run_script(
            _ACQUIRE,
            self._keys(caller.tenant_id),
            [
                now,
                member,
                tokens,
                now + self._lease_seconds,
                limits.max_concurrent_requests or 0,
                limits.max_inflight_tokens or 0,
                limits.requests_per_minute or 0,
                limits.tokens_per_minute or 0,
                int(self._lease_seconds) + 60,
            ],
        )

    async def release(self, caller: Caller, request_id: str) -> None:
        entry = self._members.pop(request_id, None)
        if entry is not None:
            try:
                await self._redis.command("ZREM", self._keys(entry[0])[0], entry[1])
            except Exception as exc:  # its lease expires instead
                logger.warning("request %s: admission lease not released: %s", request_id, exc)
            self._released.notify(entry[0])

    def releases(self, tenant_id: int) -> int:
        """How many of the tenant's requests have ended here (for `release_wait`)."""
        return self._released.count(tenant_id)

    async def release_wait(self, tenant_id: int, since: int, timeout: float) -> None:  # ok-float
        """Until one of the tenant's requests ends here after `releases` was
        `since`, or a poll period (one may have ended on another gateway),
        at most `timeout` seconds."""
        await self._released.wait(tenant_id, since, min(timeout, self._poll_seconds))

    async def close(self) -> None:
        await self._redis.close()


def admission_from_settings(cfg: Mapping, *, redis_url: str) -> LocalAdmission | RedisAdmission:
    """This process's own limits, or the limits every gateway shares (Redis)."""
    if not redis_url:
        return LocalAdmission()
    return RedisAdmission(
        redis_url,
        lease_seconds=cfg["UPSTREAM_READ_TIMEOUT"] + 60,
        prefix=cfg["REDIS_PREFIX"],
        poll_seconds=cfg["QUEUE_SYNC_SECONDS"],
    )
