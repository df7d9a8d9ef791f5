"""The gateway's key cache: one lookup per key per TTL, refusals cached
too, and a refused key hammering the gateway leaks nothing."""

import asyncio
import gc
from unittest import mock

import pytest

from gateway.callers import Caller, CallerCache, CallerRefused, Limits


def test_refusals_are_cached_and_raised_fresh_without_growing():
    cache = CallerCache(ttl_seconds=60)
    refusal = CallerRefused(401, "invalid_api_key", "invalid API key")
    loads = []

    def load(raw):
        loads.append(raw)
        raise refusal

    async def hammer():
        raised = []
        for _ in range(2000):
            with pytest.raises(CallerRefused) as info:
                await cache.get("glk_bad")
            raised.append(info.value)
        return raised

    with mock.patch("gateway.callers.caller_load", load):
        gc.collect()
        before = len(gc.get_objects())
        raised = asyncio.run(hammer())
        del raised[:-1]
        gc.collect()
        after = len(gc.get_objects())
    assert loads == ["glk_bad"]  # one database lookup for 2000 requests
    assert raised[-1] is not refusal and raised[-1].status == 401
    depth, tb = 0, raised[-1].__traceback__
    while tb is not None:
        depth, tb = depth + 1, tb.tb_next
    assert depth < 10  # not one traceback link per earlier request
    assert after - before < 500


def test_concurrent_requests_share_one_lookup_and_the_entry_expires():
    caller = Caller(
        tenant_id=1,
        tenant_slug="t",
        api_key_id=9,
        priority=50,
        cache_salt="s",
        limits=Limits(None, None, None, None),
    )
    loads = []

    def load(raw):
        loads.append(raw)
        return caller

    async def scenario():
        cache = CallerCache(ttl_seconds=0.2)
        results = await asyncio.gather(*(cache.get("glk_k") for _ in range(50)))
        assert all(r is caller for r in results)
        await asyncio.sleep(0.3)
        await cache.get("glk_k")
        return cache

    with mock.patch("gateway.callers.caller_load", load):
        cache = asyncio.run(scenario())
    assert len(loads) == 2  # 50 concurrent requests, then once more after the TTL
    assert set(cache.used_at) == {9}
