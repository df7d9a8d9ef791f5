"""Usage survives the faults an operator meets, caused for real: the
database stopped under steady traffic through two gateways, a gateway
SIGKILLed during the outage, the spool's disk full. Each test counts what
the clients saw succeed and finds it in the ledger, to the request and the
token. The database is a PostgreSQL of the test's own (tests/own_postgres.py),
stopped with pg_ctl; the gateways are `manage.py gateway` processes; the
replica is vLLM's CPU build, whose own token counters reconciliation reads."""

from __future__ import annotations

import os
import signal
import tempfile
import threading
import time

import openai
import pytest
from django.db import connection

from metering.models import UsageEvent
from metering.reconciliation import reconciliation_compute
from metering.windows import attribution_conservation_check
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    Fleet,
    fleet_model,
    gateway_health,
    gateway_metrics,
    metering_run_all,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records_written,
)
from tests.traffic import MAX_TOKENS, Traffic, ledger_tokens

OUTAGE_SECONDS = 60


def spool_of(url) -> dict:
    (worker,) = gateway_health(url)["workers"]
    return worker["spool"]


def test_the_database_stopped_for_a_minute_and_a_gateway_killed_lose_no_answered_request(
    own_postgres, vllm, tmp_path
):
    fleet = Fleet(gateway=None, model=fleet_model())
    fleet.add_tenant("a")
    fleet.add_tenant("b", currency="EUR")
    replica = fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    env = {
        "DATABASE_URL": own_postgres.url,
        # Keys and terms read again every second: serving on through the
        # outage is the stale-if-error cache's doing, not a long TTL's.
        "GATEWAY_KEY_CACHE_SECONDS": "1",
        "GATEWAY_TERMS_CACHE_SECONDS": "1",
    }
    spool_two = str(tmp_path / "spool-two")
    one, url_one = start_gateway(env=env)
    two, url_two = start_gateway(env={**env, "GATEWAY_SPOOL_DIR": spool_two})
    try:
        for url in (url_one, url_two):
            wait_for_fleet(url, replicas=1)
        first = replica_scrape(replica=replica)
        stop = threading.Event()
        traffic = [
            Traffic(url, fleet.secrets[tenant], f"{tenant}@{n}")
            for tenant in ("a", "b")
            for n, url in enumerate((url_one, url_two))
        ]
        threads = [t.run(stop) for t in traffic]
        time.sleep(3)
        own_postgres.stop()
        stopped_at = time.monotonic()
        time.sleep(OUTAGE_SECONDS / 2)
        os.kill(two.pid, signal.SIGKILL)  # its spool holds what it served so far
        two.wait(timeout=10)
        time.sleep(OUTAGE_SECONDS / 2 - 5)
        during = spool_of(url_one)
        time.sleep(5)
        own_postgres.start()
        back_at = time.monotonic()
        time.sleep(3)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)

        # Through the outage gateway one went on serving both tenants, and
        # kept their records in its spool, not in memory.
        served_in_outage = [
            at for t in traffic[0::2] for at in t.answered_at if stopped_at < at < back_at
        ]
        assert len(served_in_outage) > 100
        assert during["unwritten"] > 100 and during["bytes"] > 50_000
        assert during["oldest_unwritten_seconds"] > OUTAGE_SECONDS - 10
        for t in traffic:
            assert t.failed == [], t.failed  # no 503: every known tenant was served
        assert [t.gone for t in traffic] == [False, True, False, True]

        # Gateway two restarted on its spool replays what it had served.
        two, url_two = start_gateway(env={**env, "GATEWAY_SPOOL_DIR": spool_two})
        wait_for_records_written(url_one, timeout=60)
        wait_for_records_written(url_two, timeout=60)
        replayed = spool_of(url_two)
        assert replayed["replayed"] > 50
        assert replayed["replays_written"] == replayed["replayed"]
        assert replayed["torn"] == 0
        connection.close()
        time.sleep(1.0)  # vLLM has counted the requests the kill cut off
        last = replica_scrape(replica=replica)
    finally:
        stop_gateway(one)
        if two.poll() is None:
            stop_gateway(two)

    # Every request a client saw succeed is in the ledger, with its tokens.
    answered = {rid: tokens for t in traffic for rid, tokens in t.answered.items()}
    assert ledger_tokens(answered) == answered
    # Only the requests in flight on gateway two when it was killed were
    # never answered: reconciliation shows their tokens (vLLM counted them,
    # nobody was billed), at most what two clients' last requests could use.
    gap = reconciliation_compute(replica=replica, start=first.scraped_at, end=last.scraped_at)
    in_flight = 2
    assert 0 <= gap.generation_gap <= in_flight * MAX_TOKENS
    assert 0 <= gap.prompt_gap <= in_flight * 64
    assert gap.metered_generation_tokens >= sum(c for _, c in answered.values())
    # The ledger's attribution of the hour adds up.
    metering_run_all()
    assert attribution_conservation_check() == []


@pytest.mark.parametrize(
    ("when_full", "limit"),
    [("refuse", "disk"), ("serve", "disk"), ("refuse", "cap")],
    ids=["disk-refuse", "disk-serve", "cap-refuse"],
)
def test_a_full_spool_refuses_or_serves_as_set_and_loses_nothing(fleet, fake, when_full, limit):
    """The spool on a 64 KiB tmpfs of its own (a private mount namespace),
    or held to a 64 KiB cap on an ordinary disk; the ledger not written to
    until the gateway stops (a flush period of an hour): the spool fills
    after a hundred or so records."""
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    spool = tempfile.mkdtemp(prefix="spool-tmpfs-")
    env = {
        "GATEWAY_SPOOL_DIR": spool,
        "GATEWAY_SPOOL_FULL": when_full,
        "GATEWAY_RECORD_FLUSH_SECONDS": "3600",
        "GATEWAY_RECORD_FLUSH_MAX": "1000000",
    }
    if limit == "disk":
        proc, url = start_gateway(env=env, wrap=tmpfs_wrapper(spool, size="64k"))
    else:
        proc, url = start_gateway(env={**env, "GATEWAY_SPOOL_MAX_BYTES": str(64 * 1024)})
    try:
        wait_for_fleet(url, replicas=1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0)
        answered, refused = [], []
        for n in range(400):
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL_NAME, messages=[{"role": "user", "content": f"n{n}"}], max_tokens=3
                )
            except openai.APIStatusError as exc:
                refused.append((exc.status_code, exc.body["code"], exc.response.headers))
                continue
            answered.append(raw.headers["x-request-id"])
        metrics = gateway_metrics(url)
        state = spool_of(url)
    finally:
        stop_gateway(proc)  # graceful: what the spool and memory hold goes to the ledger
    log = url.log.read_text()
    assert state["full"] is True
    assert metrics[("gateway_spool_full", ())] == 1
    full_lines = [line for line in log.splitlines() if "is full" in line]
    assert len(full_lines) == 1, full_lines
    assert ("(a full disk:" if limit == "disk" else "(its cap:") in full_lines[0]
    assert "Traceback" not in log
    assert sum("checkpoint not written" in line for line in log.splitlines()) <= 1
    if when_full == "refuse":
        assert 50 < len(answered) < 400
        assert len(refused) == 400 - len(answered)
        assert {(status, code) for status, code, _ in refused} == {(503, "metering_unavailable")}
        assert refused[0][2]["retry-after"] == "5"
        assert "refusing new requests with 503 metering_unavailable" in full_lines[0]
        refusals = metrics[("gateway_spool_full_requests_total", (("outcome", "refused"),))]
        assert refusals == len(refused)
    else:
        assert (len(answered), refused) == (400, [])
        assert "serving requests anyway" in full_lines[0]
        assert metrics[("gateway_spool_full_requests_total", (("outcome", "served"),))] > 0
    # Nothing answered was lost: spooled, or held in memory once the disk was full.
    recorded = set(
        UsageEvent.objects.filter(request_id__in=answered).values_list("request_id", flat=True)
    )
    assert recorded == set(answered)


def tmpfs_wrapper(directory: str, *, size: str) -> list[str]:
    """A command prefix running the gateway in a mount namespace of its own
    with a tmpfs of `size` on `directory` (seen by nothing else, gone with it)."""
    return [
        "unshare", "--mount", "--propagation", "private", "sh", "-c",
        f'mount -t tmpfs -o size={size} tmpfs "{directory}" && exec "$@"', "--",
    ]  # fmt: skip
