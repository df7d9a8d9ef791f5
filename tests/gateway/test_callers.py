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


def caller_of(tenant_id: int, key_id: int, *, expires_at: float | None = None) -> Caller:
    return Caller(
        tenant_id=tenant_id,
        tenant_slug="t",
        api_key_id=key_id,
        priority=50,
        cache_salt="s",
        limits=Limits(None, None, None, None),
        expires_at=expires_at,
    )


def test_concurrent_requests_share_one_lookup_and_the_entry_expires():
    caller = caller_of(1, 9)
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


def test_a_busy_key_is_reloaded_in_the_background_while_its_entry_serves():
    """Past half its TTL an entry is reloaded without making a request
    wait on the database; past its TTL a request waits."""
    import threading
    import time

    versions = iter(range(1, 100))
    slow = threading.Event()

    def load(raw):
        if slow.is_set():
            time.sleep(0.3)  # a slow database
        return caller_of(1, next(versions))

    async def scenario():
        cache = CallerCache(ttl_seconds=1.0)
        assert (await cache.get("glk_k")).api_key_id == 1
        slow.set()
        await asyncio.sleep(0.6)  # past half the TTL
        started = time.monotonic()
        assert (await cache.get("glk_k")).api_key_id == 1  # served at once ...
        assert time.monotonic() - started < 0.1
        await asyncio.sleep(0.45)  # ... while version 2 loads
        assert (await cache.get("glk_k")).api_key_id == 2
        await asyncio.sleep(1.1)  # past the TTL: this request waits
        started = time.monotonic()
        assert (await cache.get("glk_k")).api_key_id == 3
        assert time.monotonic() - started >= 0.3

    with mock.patch("gateway.callers.caller_load", load):
        asyncio.run(scenario())


def test_an_entry_read_before_its_tenant_changed_is_used_once_not_kept():
    import threading

    loading = threading.Event()
    go_on = threading.Event()
    versions = iter(range(1, 100))

    def load(raw):
        loading.set()
        go_on.wait(5)
        return caller_of(7 if raw == "glk_a" else 8, next(versions))

    async def scenario():
        cache = CallerCache(ttl_seconds=60)
        first = asyncio.ensure_future(cache.get("glk_a"))
        await asyncio.to_thread(loading.wait, 5)
        cache.forget(8)  # another tenant: no matter
        cache.forget(7)  # the change happens while its old terms are read
        go_on.set()
        assert (await first).api_key_id == 1
        assert (await cache.get("glk_a")).api_key_id == 2  # read again, then kept
        assert (await cache.get("glk_a")).api_key_id == 2

    with mock.patch("gateway.callers.caller_load", load):
        asyncio.run(scenario())


def test_terms_are_not_kept_past_the_end_of_their_period():
    from datetime import timedelta
    from decimal import Decimal

    from django.utils import timezone

    from billing.spend.terms import SpendTerms
    from gateway.callers import TermsCache

    now = timezone.now()
    terms = SpendTerms(
        tenant_id=1,
        period_start=now - timedelta(days=29),
        period_end=now + timedelta(seconds=2),
        currency="EUR",
        accounts=(),
        cards={},
        volume={},
        discount_percent=Decimal(0),
    )
    cache = TermsCache(ttl_seconds=60)
    assert 1 < cache.expires_in(terms) <= 2
    assert cache.expires_in(None) == 60  # no terms: the TTL


def test_a_database_that_cannot_be_read_is_a_503_to_retry_and_is_not_kept():
    """Not a bare 500 and not a cached refusal: the client is told to come
    back in a second, and the next request reads the database again."""
    from django.db import OperationalError

    cache = CallerCache(ttl_seconds=60)
    loads = []

    def load(raw):
        loads.append(raw)
        if len(loads) == 1:
            raise OperationalError("connection refused")
        return caller_of(1, 2)

    async def scenario():
        with pytest.raises(CallerRefused) as down:
            await cache.get("glk_a")
        refused = down.value.refused
        assert (refused.status, refused.code, refused.retry_after) == (
            503,
            "database_unavailable",
            1,
        )
        assert refused.headers() == [(b"retry-after", b"1")]
        assert (await cache.get("glk_a")).api_key_id == 2  # read again at once

    with mock.patch("gateway.callers.caller_load", load):
        asyncio.run(scenario())
    assert loads == ["glk_a", "glk_a"]


def test_the_database_away_a_known_key_is_served_as_it_was_and_an_unknown_one_is_a_503():
    """Past its TTL, an entry the database cannot refresh goes on serving
    (up to the stale window), the database tried again a second later;
    a key never seen is a 503, and past the stale window so is the known one."""
    from django.db import OperationalError

    cache = CallerCache(ttl_seconds=0.05, stale_seconds=0.5)
    down = []
    loads = []

    def load(raw):
        loads.append(raw)
        if down:
            raise OperationalError("connection refused")
        return caller_of(1, 2)

    async def scenario():
        assert (await cache.get("glk_a")).api_key_id == 2
        down.append(True)
        await asyncio.sleep(0.1)  # past the TTL
        assert (await cache.get("glk_a")).api_key_id == 2  # stale, after one failed read
        tries = len(loads)
        for _ in range(20):
            assert (await cache.get("glk_a")).api_key_id == 2
        assert len(loads) == tries  # tried again a second later, not per request
        with pytest.raises(CallerRefused) as unknown:
            await cache.get("glk_b")
        assert unknown.value.refused.code == "database_unavailable"
        await asyncio.sleep(1.05)  # the retry due, and past the stale window
        with pytest.raises(CallerRefused) as expired:
            await cache.get("glk_a")
        assert expired.value.refused.code == "database_unavailable"

    with mock.patch("gateway.callers.caller_load", load):
        asyncio.run(scenario())


def test_a_caller_is_kept_no_longer_than_its_key_lives():
    import time as clock

    cache = CallerCache(ttl_seconds=60)

    assert cache.expires_in(caller_of(1, 9)) == 60  # a key without expiry: the TTL
    assert 1 < cache.expires_in(caller_of(1, 9, expires_at=clock.time() + 2)) <= 2
    # Expired: read again at once.
    assert cache.expires_in(caller_of(1, 9, expires_at=clock.time() - 5)) == 0
    assert cache.expires_in(CallerRefused(401, "invalid_api_key", "x").refused) == 60


def test_changes_gone_unheard_read_every_key_again_but_the_known_stay_known():
    """The change listener back after an outage (CI, 2026-12-03: it dropped
    every entry, so during a flood of unknown keys from their address the
    known tenants were 429 too_many_invalid_keys): each key is read again
    before its next use, yet still counts as known meanwhile, and with the
    database away again it is served as it was."""
    from django.db import OperationalError

    cache = CallerCache(ttl_seconds=60)
    state = {"key_id": 2, "down": False}
    loads = []

    def load(raw):
        loads.append(raw)
        if state["down"]:
            raise OperationalError("connection refused")
        return caller_of(1, state["key_id"])

    async def scenario():
        assert (await cache.get("glk_a")).api_key_id == 2
        state["key_id"] = 3  # a change the listener did not hear
        cache.expire()
        assert cache.known("glk_a")
        assert (await cache.get("glk_a")).api_key_id == 3  # read again, waited for
        assert (await cache.get("glk_a")).api_key_id == 3 and len(loads) == 2  # then kept
        cache.expire()
        state["down"] = True
        assert (await cache.get("glk_a")).api_key_id == 3  # the database away: as it was
        cache.forget(1)  # a change heard: the tenant's keys are dropped
        assert not cache.known("glk_a")

    with mock.patch("gateway.callers.caller_load", load):
        asyncio.run(scenario())
