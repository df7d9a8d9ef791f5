"""core.redis_mux against a real Redis: concurrent callers on one
connection each get their own reply, a script survives Redis forgetting
it, a killed connection fails only the calls on it and the next call
connects again, a new connection is authenticated and in its database
before any caller's command goes on it, and a Redis that is not there
fails the call (which the spend guard turns into 503 spend_unavailable,
failing closed)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import redis

from billing.pricing.rate_card import RateCard
from billing.spend.accounts import RedisSpend
from billing.spend.terms import SpendAccount, SpendTerms
from core.redis_mux import MuxRedis, RedisReplyError, Script
from gateway.errors import Refused
from gateway.spend import SpendGuard
from tests.services import free_port, redis_url, require

ADD = Script("return redis.call('INCRBY', KEYS[1], ARGV[1])")


@pytest.fixture
def url():
    found = redis_url()
    require(found is not None, "no Redis for the multiplexed client")
    return found


def run(scenario):
    asyncio.run(asyncio.wait_for(scenario(), 20))


def test_concurrent_callers_get_their_own_replies_in_one_connection(url):
    key = f"test-mux-{uuid.uuid4().hex}"

    async def scenario():
        mux = MuxRedis(url)
        try:
            echoes = await asyncio.gather(*(mux.command("ECHO", f"n{i}") for i in range(2000)))
            assert echoes == [f"n{i}".encode() for i in range(2000)]
            totals = await asyncio.gather(*(mux.run_script(ADD, [key], [1]) for _ in range(500)))
            assert sorted(totals) == list(range(1, 501))  # each increment seen once
            ids = await asyncio.gather(*(mux.command("CLIENT", "ID") for _ in range(50)))
            assert len(set(ids)) == 1  # one connection for every caller
            with pytest.raises(RedisReplyError, match="wrong number of arguments"):
                await mux.command("GET")
            assert await mux.command("ECHO", "after an error") == b"after an error"
        finally:
            await mux.close()
            redis.from_url(url).delete(key)

    run(scenario)


def test_a_script_redis_forgot_is_loaded_again(url):
    key = f"test-mux-{uuid.uuid4().hex}"

    async def scenario():
        mux = MuxRedis(url)
        try:
            assert await mux.run_script(ADD, [key], [2]) == 2
            await mux.command("SCRIPT", "FLUSH")  # as a Redis restart would
            assert await mux.run_script(ADD, [key], [3]) == 5
        finally:
            await mux.close()
            redis.from_url(url).delete(key)

    run(scenario)


def test_a_killed_connection_fails_its_calls_and_the_next_call_reconnects(url):
    async def scenario():
        mux = MuxRedis(url)
        try:
            first = await mux.command("CLIENT", "ID")
            # A call waiting on Redis when its connection is killed fails...
            waiting = asyncio.ensure_future(mux.command("BLPOP", f"nothing-{first}", 5))
            await asyncio.sleep(0.2)
            redis.from_url(url).client_kill_filter(_id=first)
            with pytest.raises(ConnectionError):
                await waiting
            # ... and the next one is answered on a new connection.
            assert await mux.command("CLIENT", "ID") != first
        finally:
            await mux.close()

    run(scenario)


@pytest.fixture
def password_redis():
    """A Redis of the test's own that asks for a password: (port, password)."""
    server = shutil.which("redis-server")
    require(server is not None, "no redis-server to start one with a password")
    port, password = free_port(), uuid.uuid4().hex
    process = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--requirepass", password,
         "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        client = redis.Redis(port=port, password=password)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield port, password
    finally:
        process.terminate()
        process.wait(timeout=10)


def test_no_command_runs_before_the_connection_is_authenticated_and_in_its_database(
    password_redis,
):
    """Calls made while a new connection is being set up (its AUTH sent, its
    SELECT not yet) wait for it: every one lands in the URL's database."""
    port, password = password_redis

    async def scenario():
        mux = MuxRedis(f"redis://:{password}@127.0.0.1:{port}/3")
        calls = [asyncio.ensure_future(mux.command("INCR", "counted"))]
        while not calls[0].done():  # a call at every turn of the loop while it connects
            calls.append(asyncio.ensure_future(mux.command("INCR", "counted")))
            await asyncio.sleep(0)
        await asyncio.gather(*calls)
        await mux.close()
        return len(calls)

    calls = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert calls > 1
    assert redis.Redis(port=port, password=password, db=0).get("counted") is None
    assert int(redis.Redis(port=port, password=password, db=3).get("counted")) == calls

    async def wrong_password():
        mux = MuxRedis(f"redis://:wrong@127.0.0.1:{port}/3")
        for _ in range(2):  # refused each time on a new connection, never left unauthenticated
            with pytest.raises(RedisReplyError, match="WRONGPASS"):
                await mux.command("PING")
        await mux.close()

    asyncio.run(asyncio.wait_for(wrong_password(), 20))


def test_an_unreachable_redis_fails_the_call_and_the_guard_answers_503():
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    since = datetime(2026, 11, 1, tzinfo=UTC)
    card = RateCard(steps={k: ((0, Decimal(1)),) for k in ("input", "cached_input", "output")})
    terms = SpendTerms(
        tenant_id=1,
        period_start=since,
        period_end=datetime(2026, 12, 1, tzinfo=UTC),
        currency="EUR",
        accounts=(SpendAccount("budget", "t1:budget:x", since, Decimal(10), Decimal(0)),),
        cards={"m": card},
        volume={},
    )

    async def scenario():
        mux = MuxRedis(nowhere)
        with pytest.raises(OSError):
            await mux.command("PING")
        guard = SpendGuard(RedisSpend(nowhere), lease_seconds=60)
        held = await guard.reserve(
            terms, model="m", request_id="r", prompt_tokens_max=5, output_tokens_max=5, choices=1
        )
        assert isinstance(held, Refused)
        assert (held.status, held.code) == (503, "spend_unavailable")
        await guard.store.close()

    run(scenario)


def test_a_redis_that_stops_answering_fails_the_call(monkeypatch):
    """A server that takes the connection and never answers: the call fails
    once its reply is COMMAND_TIMEOUT late, and the connection is dropped."""
    import core.redis_mux

    monkeypatch.setattr(core.redis_mux, "COMMAND_TIMEOUT", 0.5)

    async def scenario():
        async def silent(reader, writer):
            await reader.read(1 << 16)
            await asyncio.sleep(30)

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        mux = MuxRedis(f"redis://127.0.0.1:{port}/0")
        started = asyncio.get_running_loop().time()
        with pytest.raises(ConnectionError):
            await mux.command("PING")
        assert asyncio.get_running_loop().time() - started < 3
        server.close()

    run(scenario)
