"""Spend held exactly under concurrency (issue 18): a tenant's spend in its
billing period and the reservations of its requests in flight, against a
limit (what is left of its hard budget, or its prepaid balance).

A request reserves its worst-case charge before it is forwarded; it is
admitted only if spent + reserved + worst case <= limit, checked and
recorded in one step. When it ends it settles: the reservation goes and the
actual charge is added to spent. Two implementations with one behaviour:

- LocalSpend: in-process, for a single gateway (no Redis configured).
- RedisSpend: one atomic Lua script per reservation or settlement, so the
  limit holds across every gateway process.

Reservations are leases: one not settled within `ttl` seconds (its gateway
died, or the request outlived every timeout) expires and stops holding the
tenant's money. Its request, if it did run, reaches the ledger through the
record buffer or shows on reconciliation; the periodic correction from the
ledger then counts it (`adjust`).

Amounts are kept in whole nano-units of the currency (1e-9): a reservation
rounds up, so rounding never lets spend past the limit; a settlement rounds
to the nearest, within half a nano-unit of the ledger's exact Decimal.
Redis's scripts compare them as doubles, exact to 2**53 nano-units (about
9 million in the currency); a larger limit counts as that much.

A key names one tenant's period (`spend_key`); its account starts from the
`seed` the first reservation brings (the period's spend by the ledger), and
outlives its period by `KEY_DAYS` for the correction job.

`SpendGuard` is the gateway's use of them: a request's worst case (the
bounds `gateway.payload` puts on its prompt, output and choices, priced by
billing's rating code after the period's volume so far) reserved before it
is forwarded, refused with 402 when it does not fit, settled to what its
tokens cost when it ends. GPU-seconds are attributed after the fact by
metering: neither the reservation nor the settlement counts them (the
ledger correction does)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_CEILING, ROUND_HALF_EVEN, Decimal

from billing.pricing.rating import RateCard, usage_amount
from billing.pricing.spend_terms import SpendTerms
from gateway.queueing import Refused

NANO = Decimal("1e-9")
MAX_UNITS = 2**53 - 1
KEY_DAYS = 40


def nanos(amount: Decimal, *, up: bool = False) -> int:
    """`amount` in whole nano-units (at most MAX_UNITS either way): rounded
    up for a reservation (`up`), to the nearest otherwise."""
    rounding = ROUND_CEILING if up else ROUND_HALF_EVEN
    units = int((amount / NANO).to_integral_value(rounding=rounding))
    return max(-MAX_UNITS, min(MAX_UNITS, units))


def amount_of(units: int) -> Decimal:
    return Decimal(units) * NANO


def spend_key(*, tenant_id: int, period_start: datetime) -> str:
    return f"{tenant_id}:{period_start:%Y%m%dT%H}"


@dataclass(frozen=True)
class SpendState:
    spent: Decimal
    reserved: Decimal


@dataclass(frozen=True)
class SpendRefused:
    """The reservation does not fit: what is left (limit - spent - reserved,
    never below zero) and what was asked."""

    left: Decimal
    asked: Decimal


@dataclass
class _Account:
    spent: int = 0
    reserved: int = 0
    leases: dict[str, tuple[int, float]] | None = None  # id -> (amount, expiry)


class LocalSpend:
    """One gateway process's spend accounts."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._accounts: dict[str, _Account] = {}
        self._clock = clock

    def _account(self, key: str, seed: Decimal = Decimal(0)) -> _Account:
        account = self._accounts.get(key)
        if account is None:
            account = self._accounts[key] = _Account(spent=nanos(seed), leases={})
        now = self._clock()
        for lease_id, (amount, expiry) in list(account.leases.items()):
            if expiry <= now:
                del account.leases[lease_id]
                account.reserved -= amount
        return account

    async def reserve(
        self,
        key: str,
        lease_id: str,
        amount: Decimal,
        *,
        limit: Decimal,
        ttl: float,  # ok-float: seconds
        seed: Decimal = Decimal(0),
    ) -> SpendRefused | None:
        """Hold `amount` if it fits under `limit`; `seed`: the account's
        spent if this is its first use."""
        account = self._account(key, seed)
        want, cap = nanos(amount, up=True), nanos(limit)
        left = cap - account.spent - account.reserved
        if want > left:
            return SpendRefused(left=amount_of(max(0, left)), asked=amount)
        account.leases[lease_id] = (want, self._clock() + ttl)
        account.reserved += want
        return None

    async def settle(self, key: str, lease_id: str, actual: Decimal) -> None:
        """End the reservation (if it has not expired) and count `actual`."""
        account = self._account(key)
        lease = account.leases.pop(lease_id, None)
        if lease is not None:
            account.reserved -= lease[0]
        account.spent += nanos(actual)

    async def adjust(self, key: str, delta: Decimal) -> None:
        """Correct spent by `delta` (from the ledger: the correction job)."""
        self._account(key).spent += nanos(delta)

    async def state(self, key: str) -> SpendState:
        account = self._account(key)
        return SpendState(spent=amount_of(account.spent), reserved=amount_of(account.reserved))

    async def close(self) -> None:
        """Nothing to let go of (the same interface as RedisSpend)."""


# KEYS[1]: the account hash (spent, reserved); KEYS[2]: the leases' expiries
# (a sorted set); KEYS[3]: the leases' amounts (a hash). Expired leases go
# first, on every call.
_EXPIRE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
for _, id in ipairs(gone) do
  local amount = tonumber(redis.call('HGET', KEYS[3], id) or '0')
  redis.call('HINCRBY', KEYS[1], 'reserved', -amount)
  redis.call('HDEL', KEYS[3], id)
  redis.call('ZREM', KEYS[2], id)
end
"""

_RESERVE_LUA = (
    _EXPIRE_LUA
    + """
redis.call('HSETNX', KEYS[1], 'spent', ARGV[6])
local want, cap = tonumber(ARGV[1]), tonumber(ARGV[2])
local spent = tonumber(redis.call('HGET', KEYS[1], 'spent') or '0')
local reserved = tonumber(redis.call('HGET', KEYS[1], 'reserved') or '0')
local left = cap - spent - reserved
if want > left then
  return {0, left}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[4])
redis.call('HSET', KEYS[3], ARGV[4], want)
redis.call('HINCRBY', KEYS[1], 'reserved', want)
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], tonumber(ARGV[5])) end
return {1, left - want}
"""
)

_SETTLE_LUA = (
    _EXPIRE_LUA
    + """
local amount = redis.call('HGET', KEYS[3], ARGV[1])
if amount then
  redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(amount))
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
end
redis.call('HINCRBY', KEYS[1], 'spent', tonumber(ARGV[2]))
redis.call('EXPIRE', KEYS[1], tonumber(ARGV[3]))
return 1
"""
)

_STATE_LUA = (
    _EXPIRE_LUA
    + """
return {redis.call('HGET', KEYS[1], 'spent') or '0', redis.call('HGET', KEYS[1], 'reserved') or '0'}
"""
)


class RedisSpend:
    """Spend accounts shared by every gateway through Redis."""

    def __init__(self, url: str, *, prefix: str = "gw") -> None:
        import redis.asyncio as redis

        self._redis = redis.from_url(url)
        self._reserve = self._redis.register_script(_RESERVE_LUA)
        self._settle = self._redis.register_script(_SETTLE_LUA)
        self._state = self._redis.register_script(_STATE_LUA)
        self._prefix = prefix
        self._key_seconds = KEY_DAYS * 86400

    def _keys(self, key: str) -> list[str]:
        base = f"{self._prefix}:{{spend:{key}}}"  # one hash tag: one Cluster slot
        return [f"{base}:account", f"{base}:expiry", f"{base}:leases"]

    async def reserve(
        self,
        key: str,
        lease_id: str,
        amount: Decimal,
        *,
        limit: Decimal,
        ttl: float,  # ok-float: seconds
        seed: Decimal = Decimal(0),
    ) -> SpendRefused | None:
        admitted, left = await self._reserve(
            keys=self._keys(key),
            args=[
                nanos(amount, up=True),
                nanos(limit),
                ttl,
                lease_id,
                self._key_seconds,
                nanos(seed),
            ],
        )
        if admitted:
            return None
        return SpendRefused(left=amount_of(max(0, int(left))), asked=amount)

    async def settle(self, key: str, lease_id: str, actual: Decimal) -> None:
        await self._settle(keys=self._keys(key), args=[lease_id, nanos(actual), self._key_seconds])

    async def adjust(self, key: str, delta: Decimal) -> None:
        await self._settle(keys=self._keys(key), args=["", nanos(delta), self._key_seconds])

    async def state(self, key: str) -> SpendState:
        spent, reserved = await self._state(keys=self._keys(key), args=[])
        return SpendState(spent=amount_of(int(spent)), reserved=amount_of(int(reserved)))

    async def close(self) -> None:
        await self._redis.aclose()


@dataclass(frozen=True)
class Hold:
    """A request's reservation, and what its settlement is priced with."""

    key: str
    lease_id: str
    card: RateCard
    done: dict[str, int]


class SpendGuard:
    def __init__(self, store: LocalSpend | RedisSpend, *, lease_seconds: float) -> None:  # ok-float
        self.store = store
        self._ttl = lease_seconds

    async def reserve(
        self,
        terms: SpendTerms,
        *,
        model: str,
        request_id: str,
        prompt_tokens_max: int,
        output_tokens_max: int,
        choices: int,
    ) -> Hold | Refused:
        card = terms.cards.get(model)
        if card is None:
            return Refused(
                409,
                "model_not_priced",
                f"the model `{model}` has no price in force for this tenant, and a tenant "
                "with a budget may use only priced models",
                param="model",
            )
        done = terms.volume.get(model, {})
        worst = usage_amount(
            card, done=done, prompt=prompt_tokens_max, completion=output_tokens_max * choices
        )
        key = spend_key(tenant_id=terms.tenant_id, period_start=terms.period_start)
        refused = await self.store.reserve(
            key, request_id, worst, limit=terms.limit, ttl=self._ttl, seed=terms.spent
        )
        if refused is None:
            return Hold(key=key, lease_id=request_id, card=card, done=done)
        return Refused(
            402,
            "budget_exceeded",
            f"the budget has {_money(refused.left)} {terms.currency} left of "
            f"{_money(terms.limit)} this period, and this request may cost up to "
            f"{_money(worst)} {terms.currency} ({prompt_tokens_max:,} prompt tokens and "
            f"{output_tokens_max * choices:,} output tokens at most): lower max_tokens, "
            "or raise the budget",
            param="max_tokens",
        )

    async def settle(self, hold: Hold, *, prompt: int, cached: int, completion: int) -> None:
        actual = usage_amount(
            hold.card, done=hold.done, prompt=prompt, cached=cached, completion=completion
        )
        await self.store.settle(hold.key, hold.lease_id, actual)


def _money(amount: Decimal) -> str:
    """Enough places to tell a budget's last cents from nothing."""
    return format(amount.quantize(Decimal("0.000001")).normalize(), "f")
