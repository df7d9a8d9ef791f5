"""Spend accounts (billing/spend/accounts.py), in process and through a real
Redis: a reservation fits every account it is held on or is refused with
what is left, settles to the actual charge, expires when its gateway never
settles it, rounds so a limit is never passed, holds under concurrent
reservations, and the ledger's correction replaces the count of the hours
before its cut, once."""

from __future__ import annotations

import asyncio
import time
import uuid
from decimal import Decimal

import pytest

from billing.spend.accounts import (
    Limit,
    LocalSpend,
    RedisSpend,
    SpendRefused,
    nanos,
    redis_spend_state,
)
from core.calendar import epoch_hour
from tests.services import redis_url, require

D = Decimal
KEY = "t7:budget:20261101T000000"
PREPAID = "t7:prepaid:20261001T000000"


@pytest.fixture(params=["local", "redis"])
def make_spend(request):
    def make():
        if request.param == "local":
            return LocalSpend()
        url = redis_url()
        require(url is not None, "no Redis for shared spend accounts")
        return RedisSpend(url, prefix=f"test-{uuid.uuid4().hex}")

    return make


def run(scenario, spend) -> None:
    """`scenario(spend)` in one event loop, the Redis client closed in it."""

    async def main():
        try:
            await asyncio.wait_for(scenario(spend), 10)
        finally:
            await spend.close()

    asyncio.run(main())


def up(amount: str) -> int:
    """A reservation's nano-units (rounded up, as the gateway asks them)."""
    return nanos(D(amount), up=True)


def units(amount: str) -> int:
    """A settlement's nano-units (to the nearest, as the gateway counts them)."""
    return nanos(D(amount))


def budget(limit, seed="0"):
    return [Limit(KEY, D(limit), D(seed))]


def this_hour() -> int:
    """The epoch hour the accounts made now start in, read when a test
    runs (never at collection: a long suite crosses hours), and not within
    its last 15 seconds, so a test's accounts and its hours agree."""
    left = 3600 - time.time() % 3600
    if left < 15:
        time.sleep(left + 0.1)
    return epoch_hour(time.time())


def test_a_reservation_that_fits_then_settles_to_the_actual_charge(make_spend):
    now = this_hour()

    async def scenario(spend):
        assert await spend.state(KEY) is None  # no account until a reservation seeds it
        assert await spend.reserve(budget("1.00", seed="0.05"), "r1", up("0.30"), ttl=60) is None
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.05"), D("0.30"))
        await spend.settle([KEY], "r1", units("0.12"), hour=now)  # less than its worst case
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.17"), D(0))
        # The seed counts only when the account is new.
        assert await spend.reserve(budget("1.00", seed="0.50"), "r2", up("0.83"), ttl=60) is None

    run(scenario, make_spend())


def test_a_reservation_that_does_not_fit_is_refused_with_what_is_left(make_spend):
    async def scenario(spend):
        await spend.reserve(budget("1.00"), "r1", up("0.70"), ttl=60)
        refused = await spend.reserve(budget("1.00"), "r2", up("0.50"), ttl=60)
        assert refused == SpendRefused(index=0, left=D("0.30"))
        assert (await spend.state(KEY)).reserved == D("0.70")  # nothing of r2 kept
        assert await spend.reserve(budget("1.00"), "r3", up("0.30"), ttl=60) is None
        other = [Limit("t7:budget:20261201T000000", D("1.00"))]
        assert await spend.reserve(other, "r4", up("0.90"), ttl=60) is None

    run(scenario, make_spend())


def test_a_reservation_holds_on_every_account_or_on_none(make_spend):
    now = this_hour()

    async def scenario(spend):
        both = [Limit(KEY, D("1.00")), Limit(PREPAID, D("0.40"), D("0.10"))]
        assert await spend.reserve(both, "r1", up("0.25"), ttl=60) is None
        # The budget has 0.75 left, the prepaid balance 0.05: refused by the second.
        refused = await spend.reserve(both, "r2", up("0.06"), ttl=60)
        assert refused == SpendRefused(index=1, left=D("0.05"))
        assert (await spend.state(KEY)).reserved == D("0.25")  # nothing held on the first
        await spend.settle([KEY, PREPAID], "r1", units("0.05"), hour=now)
        assert (await spend.state(KEY)).spent == D("0.05")
        assert (await spend.state(PREPAID)).spent == D("0.15")
        assert (await spend.state(PREPAID)).reserved == D(0)

    run(scenario, make_spend())


def test_concurrent_reservations_never_pass_the_limit(make_spend):
    async def scenario(spend):
        limits = [Limit(KEY, D("1.00")), Limit(PREPAID, D("0.105"))]
        results = await asyncio.gather(
            *(spend.reserve(limits, f"r{n}", up("0.01"), ttl=60) for n in range(50))
        )
        assert sum(r is None for r in results) == 10
        assert (await spend.state(KEY)).reserved == D("0.10")
        assert (await spend.state(PREPAID)).reserved == D("0.10")

    run(scenario, make_spend())


def test_three_hundred_reservations_at_once_wait_for_a_connection_not_fail(make_spend):
    """More requests at once than a Redis pool has connections: each waits
    for one (redis-py's default pool raised MaxConnectionsError past 100,
    and a loaded gateway answered 500)."""

    async def scenario(spend):
        limits = [Limit(KEY, D("1000"))]
        results = await asyncio.gather(
            *(spend.reserve(limits, f"r{n}", up("1"), ttl=60) for n in range(300))
        )
        assert results == [None] * 300
        assert (await spend.state(KEY)).reserved == D("300")

    run(scenario, make_spend())


def test_a_reservation_never_settled_expires(make_spend):
    now = this_hour()

    async def scenario(spend):
        await spend.reserve(budget("1.00"), "lost", up("0.90"), ttl=0.2)
        assert await spend.reserve(budget("1.00"), "r2", up("0.50"), ttl=60) is not None
        await asyncio.sleep(0.3)  # its gateway died: the lease runs out
        assert (await spend.state(KEY)).reserved == D(0)
        assert await spend.reserve(budget("1.00"), "r2", up("0.50"), ttl=60) is None
        await spend.settle([KEY], "lost", units("0.20"), hour=now)  # late: its charge still counts
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.20"), D("0.50"))

    run(scenario, make_spend())


def test_a_lease_renewed_grows_holds_its_whole_amount_and_expires_later(make_spend):
    """A running request's GPU-second grant renewed under its lease: the
    renewal must fit too, the lease holds the sum, and its expiry moves."""

    now = this_hour()

    async def scenario(spend):
        assert await spend.reserve(budget("1.00"), "gpu", up("0.30"), ttl=0.3) is None
        assert await spend.reserve(budget("1.00"), "other", up("0.40"), ttl=60) is None
        refused = await spend.reserve(budget("1.00"), "gpu", up("0.31"), ttl=0.3)
        assert refused == SpendRefused(index=0, left=D("0.30"))
        await asyncio.sleep(0.2)
        assert await spend.reserve(budget("1.00"), "gpu", up("0.30"), ttl=0.3) is None
        assert (await spend.state(KEY)).reserved == D("1.00")
        await asyncio.sleep(0.2)  # past the first expiry, not the renewed one
        assert (await spend.state(KEY)).reserved == D("1.00")
        await spend.settle([KEY], "gpu", units("0.45"), hour=now)
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.45"), D("0.40"))

    run(scenario, make_spend())


def test_a_settlement_of_an_account_that_is_gone_writes_nothing(make_spend):
    now = this_hour()

    async def scenario(spend):
        await spend.settle([KEY], "r1", units("0.20"), hour=now)
        assert await spend.state(KEY) is None
        # So the next reservation still seeds it from the ledger, which has r1.
        await spend.reserve(budget("1.00", seed="0.20"), "r2", up("0.10"), ttl=60)
        assert (await spend.state(KEY)).spent == D("0.20")

    run(scenario, make_spend())


def test_rounding_never_lets_spend_past_the_limit(make_spend):
    now = this_hour()

    async def scenario(spend):
        # 1.5 nano-units reserve as 2: two of them do not fit in 3.
        assert await spend.reserve(budget("3e-9"), "a", up("1.5e-9"), ttl=60) is None
        assert await spend.reserve(budget("3e-9"), "b", up("1.5e-9"), ttl=60) is not None
        await spend.settle([KEY], "a", units("2.5e-9"), hour=now)  # to the nearest, half to even
        assert (await spend.state(KEY)).spent == D("2e-9")

    run(scenario, make_spend())


@pytest.mark.real_clock  # Redis's account reads Redis's own TIME: the machine's clock
def test_the_ledger_replaces_the_count_of_the_hours_before_its_cut_once(make_spend):
    now = this_hour()

    async def scenario(spend):
        # Seeded at 1.00 by the ledger in hour now; then requests received in
        # now (0.30) and now + 1 (0.20), settled.
        await spend.reserve(budget("10", seed="1.00"), "a", up("1"), ttl=60)
        await spend.settle([KEY], "a", units("0.30"), hour=now)
        await spend.reserve(budget("10"), "b", up("1"), ttl=60)
        await spend.settle([KEY], "b", units("0.20"), hour=now + 1)
        assert (await spend.state(KEY)).spent == D("1.50")
        # No cut at or before the account's first hour: the seed counted all of it.
        assert await spend.correct(KEY, cut=now, ledger=D("9")) is None
        # The ledger says the usage before now + 1 cost 1.34 (GPU-seconds the
        # gateway did not count, say): the count of it was 1.30.
        drift = await spend.correct(KEY, cut=now + 1, ledger=D("1.34"))
        assert drift == D("-0.04")
        assert (await spend.state(KEY)).spent == D("1.54")  # 1.34 + now + 1's 0.20
        assert await spend.correct(KEY, cut=now + 1, ledger=D("1.34")) is None  # once
        # A request received before the cut that ends after it: the ledger
        # had not seen it, so it adds to the corrected count.
        await spend.reserve(budget("10"), "c", up("1"), ttl=60)
        await spend.settle([KEY], "c", units("0.06"), hour=now)
        assert (await spend.state(KEY)).spent == D("1.60")
        drift = await spend.correct(KEY, cut=now + 2, ledger=D("1.60"))
        assert drift == D(0)
        assert await spend.correct("t7:budget:19990101T000000", cut=now, ledger=D(1)) is None

    run(scenario, make_spend())


def test_the_pages_read_an_account_from_redis_without_an_event_loop():
    url = redis_url()
    require(url is not None, "no Redis for shared spend accounts")
    prefix = f"test-{uuid.uuid4().hex}"
    spend = RedisSpend(url, prefix=prefix)
    run(lambda s: s.reserve(budget("1", seed="0.25"), "r", up("0.5"), ttl=60), spend)
    state = redis_spend_state(url, KEY, prefix=prefix)
    assert (state.spent, state.reserved) == (D("0.25"), D("0.5"))
    assert redis_spend_state(url, PREPAID, prefix=prefix) is None


def test_nano_units_round_up_for_reservations_and_clamp():
    assert nanos(D("1e-10"), up=True) == 1 and nanos(D("1e-10")) == 0
    assert nanos(D("1e12")) == 2**53 - 1
