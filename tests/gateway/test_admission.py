"""Admission semantics, the same for the in-process and the Redis limiter."""

from __future__ import annotations

import asyncio
import uuid
from unittest import mock

import pytest

from gateway.admission import LocalAdmission, RedisAdmission
from gateway.callers import Caller, Limits
from tests.services import redis_url, require


def caller(tenant_id: int = 1, **limits) -> Caller:
    values = {
        "max_concurrent_requests": None,
        "requests_per_minute": None,
        "tokens_per_minute": None,
        "max_inflight_tokens": None,
        **limits,
    }
    return Caller(
        tenant_id=tenant_id,
        tenant_slug=f"t{tenant_id}",
        api_key_id=1,
        priority=50,
        cache_salt="s",
        limits=Limits(**values),
    )


@pytest.fixture(params=["local", "redis"])
def admission(request):
    """A factory: the Redis client must be made inside the test's event loop."""
    if request.param == "local":
        return LocalAdmission
    url = redis_url()
    require(url is not None, "no Redis")
    prefix = f"test-{uuid.uuid4().hex}"
    return lambda: RedisAdmission(url, lease_seconds=60, prefix=prefix)


def run(make, scenario):
    async def main():
        limiter = make()
        try:
            await scenario(limiter)
        finally:
            await limiter.close()

    asyncio.run(main())


def test_concurrency_limit_and_release(admission):
    c = caller(max_concurrent_requests=2)

    async def scenario(admission):
        assert await admission.acquire(c, "r1", 10) is None
        assert await admission.acquire(c, "r2", 10) is None
        refused = await admission.acquire(c, "r3", 10)
        assert (refused.limit, refused.value, refused.retry_after) == (
            "max_concurrent_requests",
            2,
            1,
        )
        assert "concurrent requests (limit 2)" in refused.message
        other = caller(tenant_id=2, max_concurrent_requests=2)
        assert await admission.acquire(other, "x1", 10) is None  # per tenant
        await admission.release(c, "r1")
        assert await admission.acquire(c, "r3", 10) is None

    run(admission, scenario)


def test_inflight_token_budget(admission):
    c = caller(max_inflight_tokens=1000)

    async def scenario(admission):
        assert await admission.acquire(c, "a", 600) is None
        refused = await admission.acquire(c, "b", 401)
        assert refused.limit == "max_inflight_tokens"
        assert await admission.acquire(c, "b", 400) is None
        await admission.release(c, "a")
        assert await admission.acquire(c, "c", 600) is None

    run(admission, scenario)


def test_requests_and_tokens_per_minute_use_a_sliding_window(admission):
    """At 30 s into a minute, half of the previous minute still counts."""
    c = caller(requests_per_minute=10)
    t = caller(tenant_id=3, tokens_per_minute=1000)
    minute = 1_800_000_000 - (1_800_000_000 % 60)

    async def scenario(admission):
        with mock.patch("gateway.admission.time.time", return_value=minute + 50):
            for i in range(8):
                assert await admission.acquire(c, f"p{i}", 1) is None
            assert await admission.acquire(t, "tp", 800) is None
        with mock.patch("gateway.admission.time.time", return_value=minute + 90):
            # previous minute: 8 requests weighted 0.5 = 4; room for 6 more
            for i in range(6):
                assert await admission.acquire(c, f"n{i}", 1) is None
            refused = await admission.acquire(c, "n6", 1)
            assert refused.limit == "requests_per_minute"
            # Room again once enough of the previous minute has slid out:
            # 8 * (1 - 37.5 / 60) + 6 + 1 = 10 at 37.5 s into the minute.
            assert refused.retry_after == 8
            # tokens: 800 * 0.5 = 400 still counted
            assert (await admission.acquire(t, "big", 601)).limit == "tokens_per_minute"
            assert await admission.acquire(t, "fits", 600) is None

    run(admission, scenario)


def test_retry_after_runs_into_the_next_minute_when_this_one_is_full(admission):
    """4 requests 10 s into a minute fill a limit of 4: the next fits when
    this minute weighs 3 in the window, 15 s into the next (65 s on); asked
    then, it is admitted."""
    c = caller(requests_per_minute=4)
    minute = 1_800_000_000 - (1_800_000_000 % 60)

    async def scenario(admission):
        with mock.patch("gateway.admission.time.time", return_value=minute + 10):
            for i in range(4):
                assert await admission.acquire(c, f"p{i}", 1) is None
            refused = await admission.acquire(c, "p4", 1)
            assert (refused.limit, refused.retry_after) == ("requests_per_minute", 65)
        with mock.patch("gateway.admission.time.time", return_value=minute + 74):
            assert (await admission.acquire(c, "early", 1)).limit == "requests_per_minute"
        with mock.patch("gateway.admission.time.time", return_value=minute + 75):
            assert await admission.acquire(c, "on-time", 1) is None

    run(admission, scenario)


def test_unlimited_policy_admits_everything(admission):
    c = caller()

    async def scenario(admission):
        for i in range(50):
            assert await admission.acquire(c, f"r{i}", 10_000) is None

    run(admission, scenario)


def test_release_wait_wakes_on_a_release_and_misses_none(admission):
    c = caller(max_concurrent_requests=1)

    async def scenario(admission):
        assert await admission.acquire(c, "r1", 10) is None
        since = admission.releases(c.tenant_id)
        assert (await admission.acquire(c, "r2", 10)).limit == "max_concurrent_requests"
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, lambda: asyncio.ensure_future(admission.release(c, "r1")))
        started = loop.time()
        while True:  # as the gateway's queue does (Redis also wakes to poll)
            await admission.release_wait(c.tenant_id, since, 5)
            since = admission.releases(c.tenant_id)
            if await admission.acquire(c, "r2", 10) is None:
                break
        assert loop.time() - started < 1  # woken by the release, not the timeout
        # A release before the wait began is not missed.
        since = admission.releases(c.tenant_id)
        await admission.release(c, "r2")
        started = loop.time()
        await admission.release_wait(c.tenant_id, since, 5)
        assert loop.time() - started < 0.01

    run(admission, scenario)


def test_retry_after_is_the_longest_wait_of_the_limits_a_request_is_over(admission):
    """Over both per-minute limits 10 s into a minute: room for one more
    request in 80 s, for 900 more tokens only in 104 s; told the later."""
    c = caller(requests_per_minute=2, tokens_per_minute=1000)
    minute = 1_800_000_000 - (1_800_000_000 % 60)

    async def scenario(admission):
        with mock.patch("gateway.admission.time.time", return_value=minute + 10):
            assert await admission.acquire(c, "a", 500) is None
            assert await admission.acquire(c, "b", 500) is None
            refused = await admission.acquire(c, "c", 900)
            assert (refused.limit, refused.retry_after) == ("tokens_per_minute", 104)

    run(admission, scenario)
