"""Reconciliation against a real vLLM replica: a gateway killed with SIGKILL
under load loses the records still in its buffer (at most one flush
interval of them), and reconciliation flags exactly that kind of gap; a
gateway stopped gracefully loses nothing and the gap is zero."""

from __future__ import annotations

import os
import signal
import threading
import time

import openai
import pytest

from metering.models import UsageEvent
from metering.reconciliation import reconciliation_compute
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME
from tests.fleet import start_gateway, stop_gateway, wait_for_fleet

pytestmark = [pytest.mark.slow, pytest.mark.vllm]
FLUSH_SECONDS = 2.0


def load(url: str, secret: str, *, stop: threading.Event, threads: int = 3) -> tuple:
    """Requests from `threads` clients until `stop` (or the gateway goes
    away); returns (request id, prompt, completion, completed at) of each
    request whose answer arrived."""
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=secret, max_retries=0, timeout=60)
    done: list[tuple] = []

    def worker():
        while not stop.is_set():
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=MODEL_NAME,
                    messages=[{"role": "user", "content": "count to twenty"}],
                    max_tokens=16,
                    extra_body={"ignore_eos": True},
                )
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
    return done, workers


def run_load_then(fleet, vllm, finish) -> tuple:
    fleet.add_tenant("a")
    replica = fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    proc, url = start_gateway(env={"GATEWAY_RECORD_FLUSH_SECONDS": str(FLUSH_SECONDS)})
    wait_for_fleet(url, replicas=1)
    first = replica_scrape(replica=replica)
    stop = threading.Event()
    done, workers = load(url, fleet.secrets["a"], stop=stop)
    time.sleep(4)
    stopped_at = finish(proc)
    stop.set()
    for w in workers:
        w.join(timeout=60)
    time.sleep(1.0)  # vLLM has counted the aborted requests' tokens
    last = replica_scrape(replica=replica)
    gap = reconciliation_compute(replica=replica, start=first.scraped_at, end=last.scraped_at)
    recorded = set(
        UsageEvent.objects.filter(request_id__in=[d[0] for d in done]).values_list(
            "request_id", flat=True
        )
    )
    return gap, done, recorded, stopped_at


def test_a_killed_gateway_shows_up_as_a_gap_of_one_flush_interval(fleet, vllm):
    def kill(proc):
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        return time.time()

    gap, done, recorded, killed_at = run_load_then(fleet, vllm, kill)
    lost = [d for d in done if d[0] not in recorded]
    assert len(done) > 10 and lost, "some answered requests were still in the buffer"
    # Only the last flush interval's records were lost (plus scheduling slack).
    assert all(killed_at - d[3] <= FLUSH_SECONDS + 1.0 for d in lost)
    # Reconciliation flags them: vLLM served at least the lost answers' tokens
    # beyond what reached the ledger (also the requests cut off by the kill).
    assert gap.prompt_gap >= sum(d[1] for d in lost) > 0
    assert gap.generation_gap >= sum(d[2] for d in lost) > 0


def test_a_graceful_stop_loses_nothing(fleet, vllm):
    def graceful(proc):
        stop_gateway(proc)  # SIGTERM: in-flight requests finish, the buffer is flushed
        return time.time()

    gap, done, recorded, _ = run_load_then(fleet, vllm, graceful)
    assert len(done) > 10 and recorded == {d[0] for d in done}
    assert (gap.prompt_gap, gap.generation_gap) == (0, 0)
    assert gap.metered_generation_tokens == sum(d[2] for d in done)
