"""Spend accounts (gateway/spend.py), in process and through a real Redis:
a reservation fits the limit or is refused with what is left, settles to
the actual charge, expires when its gateway never settles it, rounds so
the limit is never passed, and holds under concurrent reservations."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from gateway.spend import LocalSpend, RedisSpend, SpendRefused, nanos, spend_key
from tests.services import redis_url, require

D = Decimal


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


KEY = spend_key(tenant_id=7, period_start=datetime(2026, 11, 1, tzinfo=UTC))


def test_a_reservation_that_fits_then_settles_to_the_actual_charge(make_spend):
    async def scenario(spend):
        assert await spend.reserve(KEY, "r1", D("0.30"), limit=D("1.00"), ttl=60) is None
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D(0), D("0.30"))
        await spend.settle(KEY, "r1", D("0.12"))  # less than its worst case
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.12"), D(0))

    run(scenario, make_spend())


def test_a_reservation_that_does_not_fit_is_refused_with_what_is_left(make_spend):
    async def scenario(spend):
        await spend.reserve(KEY, "r1", D("0.70"), limit=D("1.00"), ttl=60)
        refused = await spend.reserve(KEY, "r2", D("0.50"), limit=D("1.00"), ttl=60)
        assert refused == SpendRefused(left=D("0.30"), asked=D("0.50"))
        assert (await spend.state(KEY)).reserved == D("0.70")  # nothing of r2 kept
        assert await spend.reserve(KEY, "r3", D("0.30"), limit=D("1.00"), ttl=60) is None
        other = spend_key(tenant_id=7, period_start=datetime(2026, 12, 1, tzinfo=UTC))
        assert await spend.reserve(other, "r4", D("0.90"), limit=D("1.00"), ttl=60) is None

    run(scenario, make_spend())


def test_concurrent_reservations_never_pass_the_limit(make_spend):
    async def scenario(spend):
        results = await asyncio.gather(
            *(spend.reserve(KEY, f"r{n}", D("0.01"), limit=D("0.105"), ttl=60) for n in range(50))
        )
        assert sum(r is None for r in results) == 10
        assert (await spend.state(KEY)).reserved == D("0.10")

    run(scenario, make_spend())


def test_a_reservation_never_settled_expires(make_spend):
    async def scenario(spend):
        await spend.reserve(KEY, "lost", D("0.90"), limit=D("1.00"), ttl=0.2)
        assert await spend.reserve(KEY, "r2", D("0.50"), limit=D("1.00"), ttl=60) is not None
        await asyncio.sleep(0.3)  # its gateway died: the lease runs out
        assert (await spend.state(KEY)).reserved == D(0)
        assert await spend.reserve(KEY, "r2", D("0.50"), limit=D("1.00"), ttl=60) is None
        await spend.settle(KEY, "lost", D("0.20"))  # late: its charge still counts
        state = await spend.state(KEY)
        assert (state.spent, state.reserved) == (D("0.20"), D("0.50"))

    run(scenario, make_spend())


def test_rounding_never_lets_spend_past_the_limit(make_spend):
    async def scenario(spend):
        # 1.5 nano-units reserve as 2: two of them do not fit in 3.
        assert await spend.reserve(KEY, "a", D("1.5e-9"), limit=D("3e-9"), ttl=60) is None
        assert await spend.reserve(KEY, "b", D("1.5e-9"), limit=D("3e-9"), ttl=60) is not None
        await spend.settle(KEY, "a", D("2.5e-9"))  # to the nearest, half to even
        assert (await spend.state(KEY)).spent == D("2e-9")
        await spend.adjust(KEY, D("-1e-9"))  # the ledger's correction
        assert (await spend.state(KEY)).spent == D("1e-9")

    run(scenario, make_spend())


def test_nano_units_round_up_for_reservations_and_clamp():
    assert nanos(D("1e-10"), up=True) == 1 and nanos(D("1e-10")) == 0
    assert nanos(D("1e12")) == 2**53 - 1
