"""Reconciliation against a real vLLM replica. A gateway without a spool
(GATEWAY_SPOOL_DIR empty) killed with SIGKILL loses the records still in
its buffer (at most one flush interval of them), and reconciliation flags
exactly that gap (to the token when nothing was in flight), while the
spend it had reserved for the requests in flight expires with their
leases. With its spool (the default) the same kill loses nothing: the
gateway restarted on it replays the records, and the gap is zero. A
gateway stopped gracefully loses nothing either way."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import openai
import pytest
from django.utils import timezone

from billing.models import ModelPrice, PriceBook
from billing.spend.accounts import redis_spend_state
from billing.spend.terms import spend_terms
from metering.models import UsageEvent
from metering.reconciliation import reconciliation_compute
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    gateway_health,
    gateway_metrics,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records,
)
from tests.services import redis_url, require

FLUSH_SECONDS = 2.0


def load(url: str, secret: str, *, stop: threading.Event, threads: int = 3) -> tuple:
    """Requests from `threads` clients until `stop` (or the gateway goes
    away); returns (request id, prompt, completion, completed at) of each
    request whose answer arrived."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=60)
    done: list[tuple] = []
    refused: list[tuple] = []

    def worker():
        while not stop.is_set():
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL_NAME,
                    messages=[{"role": "user", "content": "count to twenty"}],
                    max_tokens=16,
                    extra_body={"ignore_eos": True},
                )
            except openai.APIStatusError as exc:  # an answer, not the gateway gone
                refused.append((exc.status_code, exc.message[:200]))
                continue
            except openai.APIError:
                return
            usage = raw.parse().usage
            done.append(
                (
                    raw.headers["x-request-id"],
                    usage.prompt_tokens,
                    usage.completion_tokens,
                    time.time(),
                )
            )

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for w in workers:
        w.start()
    return done, refused, workers


def run_load_then(fleet, vllm, finish, *, env=None) -> tuple:
    fleet.add_tenant("a", monthly_budget=Decimal(1000))  # held per request, never refused
    priced(fleet)
    replica = fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    proc, url = start_gateway(
        env={"GATEWAY_RECORD_FLUSH_SECONDS": str(FLUSH_SECONDS), **(env or {})}
    )
    wait_for_fleet(url, replicas=1)
    first = replica_scrape(replica=replica)
    stop = threading.Event()
    done, refused, workers = load(url, fleet.secrets["a"], stop=stop)
    time.sleep(4)
    stopped_at = finish(proc)
    stop.set()
    for w in workers:
        w.join(timeout=60)
    assert refused == []  # every request answered until the gateway went away
    time.sleep(1.0)  # vLLM has counted the aborted requests' tokens
    last = replica_scrape(replica=replica)
    gap = reconciliation_compute(replica=replica, start=first.scraped_at, end=last.scraped_at)
    recorded = set(
        UsageEvent.objects.filter(request_id__in=[d[0] for d in done]).values_list(
            "request_id", flat=True
        )
    )
    return gap, done, recorded, stopped_at


def priced(fleet) -> None:
    book = PriceBook.objects.create(name="list", effective_from=datetime(2026, 1, 1, tzinfo=UTC))
    ModelPrice.objects.create(
        book=book,
        served_model=fleet.model,
        input_per_mtok=Decimal(1),
        cached_input_per_mtok=Decimal(1),
        output_per_mtok=Decimal(2),
    )


def test_a_killed_gateway_shows_up_as_a_gap_of_one_flush_interval(fleet, vllm):
    url = redis_url()
    require(url is not None, "no Redis: the spend a killed gateway held is read from it")
    prefix = f"test-{uuid.uuid4().hex}"
    env = {
        "REDIS_URL": url,
        "GATEWAY_REDIS_PREFIX": prefix,
        "GATEWAY_SPEND_LEASE_SECONDS": "5",
        "GATEWAY_SPOOL_DIR": "",  # records in memory only: what reconciliation is for
    }
    held = {}

    def kill(proc):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        killed_at = time.time()
        (account,) = spend_terms(tenant=fleet.tenants["a"], now=timezone.now()).accounts
        held["key"] = account.key
        held["at_kill"] = redis_spend_state(url, account.key, prefix=prefix).reserved

        return killed_at

    gap, done, recorded, killed_at = run_load_then(fleet, vllm, kill, env=env)
    # The requests in flight held their worst case; nobody will settle them,
    # and their leases run out.
    assert held["at_kill"] > 0
    time.sleep(max(0.0, killed_at + 5.5 - time.time()))
    assert redis_spend_state(url, held["key"], prefix=prefix).reserved == 0
    lost = [d for d in done if d[0] not in recorded]
    assert len(done) > 10 and lost, "some answered requests were still in the buffer"
    # Only the last flush interval's records were lost (plus scheduling slack).
    assert all(killed_at - d[3] <= FLUSH_SECONDS + 1.0 for d in lost)
    # Reconciliation flags them: vLLM served at least the lost answers' tokens
    # beyond what reached the ledger (also the requests cut off by the kill).
    assert gap.prompt_gap >= sum(d[1] for d in lost) > 0
    assert gap.generation_gap >= sum(d[2] for d in lost) > 0


@pytest.mark.parametrize("spool", ["", "spooled", "torn"], ids=["memory-only", "spooled", "torn"])
def test_a_gateway_killed_between_flushes_loses_what_reconciliation_shows_to_the_token(
    fleet, vllm, tmp_path, spool
):
    """Nothing in flight at the kill (every answer arrived, none written
    yet). In memory only: the gap is exactly the lost requests' tokens.
    Spooled: the gateway restarted on its spool writes all four, and the
    gap is zero to the token. Torn (the last record cut mid-write, as a
    power loss leaves it): the first three replay, the torn one is counted
    on the gateway's health and metrics, and the gap is its tokens exactly."""
    fleet.add_tenant("a")
    replica = fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    env = {
        "GATEWAY_RECORD_FLUSH_SECONDS": "30",
        "GATEWAY_SPOOL_DIR": str(tmp_path / "spool") if spool else "",
    }
    proc, url = start_gateway(env=env)
    wait_for_fleet(url, replicas=1)
    first = replica_scrape(replica=replica)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0)
    answered = []
    for n in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": f"count to {n + 3}"}],
            max_tokens=8 + n,
            extra_body={"ignore_eos": True},
        )
        answered.append((raw.headers["x-request-id"], raw.parse().usage))
    os.kill(proc.pid, signal.SIGKILL)  # within the 30 s flush interval: all four unwritten
    proc.wait(timeout=10)
    ids = [request_id for request_id, _ in answered]
    assert not UsageEvent.objects.filter(request_id__in=ids).exists()
    lost = [usage for _, usage in answered] if not spool else []
    if spool == "torn":
        (segment,) = (tmp_path / "spool").glob("slot-0/*.seg")
        os.truncate(segment, segment.stat().st_size - 7)
        lost = [answered[-1][1]]
    if spool:
        proc, url = start_gateway(env={**env, "GATEWAY_RECORD_FLUSH_SECONDS": "0.1"})
        try:
            kept = len(answered) - len(lost)
            wait_for_records(ids[:kept])
            (worker,) = gateway_health(url)["workers"]
            state = worker["spool"]
            assert (state["replayed"], state["replays_written"]) == (kept, kept)
            assert state["torn"] == len(lost)
            torn = gateway_metrics(url).get(("gateway_spool_torn_records_total", ()), 0)
            assert torn == len(lost)
        finally:
            stop_gateway(proc)
    time.sleep(1.0)
    last = replica_scrape(replica=replica)
    gap = reconciliation_compute(replica=replica, start=first.scraped_at, end=last.scraped_at)
    assert gap.prompt_gap == sum(u.prompt_tokens for u in lost)
    assert gap.generation_gap == sum(u.completion_tokens for u in lost)
    assert gap.vllm_generation_tokens == 8 + 9 + 10 + 11
    recorded = UsageEvent.objects.filter(request_id__in=ids).count()
    assert recorded == len(answered) - len(lost)


def test_a_graceful_stop_loses_nothing(fleet, vllm):
    def graceful(proc):
        stop_gateway(proc)  # SIGTERM: in-flight requests finish, the buffer is flushed
        return time.time()

    gap, done, recorded, _ = run_load_then(fleet, vllm, graceful)
    assert len(done) > 10 and recorded == {d[0] for d in done}
    assert (gap.prompt_gap, gap.generation_gap) == (0, 0)
    assert gap.metered_generation_tokens == sum(d[2] for d in done)
