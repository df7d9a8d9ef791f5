"""Nobody without a key can grow the gateway's memory or push the tenants
it knows out of its cache (issue 60, finding 1), attacked as an attacker
would: a real gateway, 50,000 requests carrying random 8 KB bearer strings,
then 5,000 well-shaped keys that do not exist, while the database is down
and two known tenants (USD and EUR) keep sending. The junk is refused
before any cache or database sees it, the key-shaped refusals are kept
apart and bounded, the gateway's memory stays within 32 MiB of where it
began, and the known tenants are served throughout from what it knew.
Headers over 16 KiB are a 431. An address that keeps sending unknown keys
is refused (429) without a lookup once its budget is spent."""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import string
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving.tiny_model import MODEL_NAME
from tests.fleet import Fleet, fleet_model, start_gateway, stop_gateway, wait_for_fleet
from tests.gateway.fake_upstream import FakeUpstream
from tests.traffic import Traffic

JUNK, SHAPED = 50_000, 5_000
RSS_BOUND = 32 * 1024 * 1024  # measured 13.6 MiB; 423 MiB before the fix
ALPHABET = string.ascii_letters + string.digits


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def _flood(url: str, keys, *, concurrency: int = 16) -> dict[int, int]:
    """POST a chat completion with each key over `concurrency` kept-alive
    connections (plain asyncio streams: a client library's own cost per
    request would be most of the test's time); how many answers of each
    status."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"model": MODEL_NAME, "messages": [{"role": "user", "content": "x"}]})
    statuses: dict[int, int] = {}
    queue = iter(keys)

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        try:
            for key in queue:
                writer.write(
                    (
                        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
                        f"Authorization: Bearer {key}\r\nContent-Type: application/json\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n{body}"
                    ).encode()
                )
                head = await reader.readuntil(b"\r\n\r\n")
                status = int(head.split(b" ", 2)[1])
                length = re.search(rb"(?i)content-length: *(\d+)", head)
                if length:
                    await reader.readexactly(int(length[1]))
                else:  # chunked
                    while size := int(await reader.readuntil(b"\r\n"), 16):
                        await reader.readexactly(size + 2)
                    await reader.readuntil(b"\r\n")
                statuses[status] = statuses.get(status, 0) + 1
        finally:
            writer.close()

    await asyncio.gather(*(one() for _ in range(concurrency)))
    return statuses


def _junk(n: int):
    for _ in range(n):
        yield secrets.token_urlsafe(6 * 1024)  # 8,192 characters


def _shaped(n: int):
    for _ in range(n):
        prefix = "".join(secrets.choice(ALPHABET) for _ in range(10))
        yield f"glk_{prefix}_" + "".join(secrets.choice(ALPHABET) for _ in range(43))


def test_a_flood_of_junk_keys_costs_no_memory_and_known_tenants_are_served_through_an_outage(
    own_postgres,
):
    fleet = Fleet(gateway=None, model=fleet_model())
    fleet.add_tenant("a")
    fleet.add_tenant("b", currency="EUR")
    upstream = FakeUpstream().start()
    fleet.add_replica("alpha", upstream.base_url, "shared")
    gateway, url = start_gateway(env={"DATABASE_URL": own_postgres.url})
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        wait_for_fleet(url, replicas=1)
        traffic = [Traffic(url, fleet.secrets[t], t) for t in ("a", "b")]
        threads = [t.run(stop) for t in traffic]
        time.sleep(2)  # both tenants known to the gateway
        before = _rss(gateway.pid)

        own_postgres.stop()
        try:
            began = time.monotonic()
            junk = asyncio.run(_flood(url, _junk(JUNK)))
            shaped = asyncio.run(_flood(url, _shaped(SHAPED)))
            flooded_for = time.monotonic() - began
            after = _rss(gateway.pid)
            served = [sum(began < at for at in t.answered_at) for t in traffic]
            huge = httpx.post(
                f"{url}/v1/chat/completions",
                json={"model": MODEL_NAME, "messages": []},
                headers={"Authorization": "Bearer glk_x", "X-Padding": "p" * 20_000},
                timeout=10,
            )
        finally:
            own_postgres.start()
        # The database back: unknown key-shaped keys are looked up, 401, until
        # the address's budget (a burst of 200, 20 a second) is spent; then
        # 429 without a lookup, while the known tenants go on (their keys
        # are served from memory).
        budget = asyncio.run(_flood(url, _shaped(600)))
        served_after = [len(t.answered_at) for t in traffic]
        time.sleep(1)
        still = [len(t.answered_at) for t in traffic]
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        stop_gateway(gateway)
        upstream.stop()

    # Junk is refused as what it is, before any lookup; a key-shaped string
    # the gateway cannot look up (the database away) is a 503.
    assert junk == {401: JUNK}, junk
    assert shaped == {503: SHAPED}, shaped
    assert after - before < RSS_BOUND, f"grew {(after - before) / 2**20:.1f} MiB"
    # The known tenants went on being served all through the flood and the outage.
    assert all(n > 10 for n in served), (served, flooded_for)
    for t in traffic:
        assert t.failed == [] and not t.gone, t.failed[:3]
    assert huge.status_code == 431 and huge.json()["error"]["code"] == "headers_too_large"
    assert set(budget) == {401, 429} and 200 <= budget[401] <= 300, budget
    assert all(b > a for a, b in zip(served_after, still, strict=True))


def test_refusals_are_kept_apart_and_never_push_out_a_live_entry():
    """The cache itself: 1,000 refusals in a cache of 10 refusals and 2
    entries leave the live tenant's entry where it was."""
    from gateway.callers import CallerRefused, LoadingCache

    class Cache(LoadingCache):
        def load(self, key):
            if key == "live":
                return "tenant 1"
            raise CallerRefused(401, "invalid_api_key", "invalid API key")

        def tenant_of(self, key, value):
            return 1

    cache = Cache(ttl_seconds=60, max_entries=2, max_refusals=10)

    async def attack():
        assert await cache.lookup("live") == "tenant 1"
        for n in range(1_000):
            with pytest.raises(CallerRefused):
                await cache.lookup(f"junk-{n}")

    asyncio.run(attack())
    assert list(cache._entries) == ["live"] and len(cache._refusals) == 10
    assert all(isinstance(k, bytes) and len(k) == 16 for k in cache._refusals)  # digests
