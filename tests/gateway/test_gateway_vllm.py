"""The gateway in front of real vLLM-CPU replicas, driven by the official
openai client: usage recorded exactly, aborts billed up to the last chunk,
priority and cache isolation reaching vLLM, limits, routing and failover."""

from __future__ import annotations

import json
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from metering.models import UsageEvent
from serving.choices import PoolKind
from serving.launcher import ENGINE_NICE, replica_stop
from serving.tiny_model import MAX_POSITIONS, MODEL_NAME
from tenants.services import api_key_revoke
from tests.fleet import gateway_froze, start_gateway, stop_gateway, wait_for_records
from tests.services import redis_url, require

HELLO = [{"role": "user", "content": "hello there"}]
EXACT = {"ignore_eos": True}  # random weights may emit EOS early; tests want exact counts


def chat(client: openai.OpenAI, max_tokens: int = 7, **kwargs):
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=kwargs.pop("messages", HELLO),
        max_tokens=max_tokens,
        extra_body=EXACT,
        **kwargs,
    )
    return raw.headers["x-request-id"], raw.parse()


@contextmanager
def hold_stream(
    gateway: str,
    secret: str,
    *,
    max_tokens: int = 1500,
    path: str = "/v1/chat/completions",
    body: dict | None = None,
):
    """A streaming request kept open until the block ends. The client reads
    nothing more and its socket takes little, so the gateway's relay waits
    on it and the request holds its slot even after vLLM, which does not
    wait for its reader, has generated it all. A small receive buffer is not
    enough: on loopback (64 KB segments) the gateway's send buffer grows to
    about 3 MB, more than 1,500 tokens' chunks (0.5 MB), and the stream
    would end as soon as vLLM is done. Small segments keep the send buffer
    near 130 KB (measured), about 400 tokens' chunks. Both are set before
    the connection is made (the segment size is agreed then), so the
    request is written on a plain socket: httpx sets socket options only
    once connected. `body`: another API's request (the model and streaming
    are added)."""
    url = httpx.URL(gateway)
    body = body or {"messages": HELLO, "max_tokens": max_tokens}
    payload = json.dumps({"model": MODEL_NAME, "stream": True, **EXACT, **body}).encode()
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        held.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, 536)
        held.settimeout(30)
        held.connect((url.host, url.port))
        held.sendall(
            f"POST {path} HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            f"Authorization: Bearer {secret}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
            + payload
        )
        received = b""
        while b"\r\n\r\n" not in received or b"data: " not in received.partition(b"\r\n\r\n")[2]:
            chunk = held.recv(4096)
            assert chunk, f"the gateway closed the stream: {received!r}"
            received += chunk
        head = received.partition(b"\r\n\r\n")[0].decode()
        assert head.startswith("HTTP/1.1 200"), received
        (request_id,) = re.findall(r"(?im)^x-request-id: *(\S+)", head)
        yield request_id


def vllm_metric(base_url: str, name: str) -> float:
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return float(re.search(rf"^vllm:{name}\{{[^}}]*\}} (\S+)$", text, re.M)[1])


def generation_tokens_total(base_url: str) -> float:
    return vllm_metric(base_url, "generation_tokens_total")


def test_recorded_usage_equals_what_vllm_returned(fleet, vllm):
    fleet.add_tenant("a")
    fleet.add_tenant("b")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    expected = {}
    for tenant in ("a", "b"):
        client = fleet.client(tenant)
        rid, response = chat(client, max_tokens=7)
        expected[rid] = (tenant, response.usage.prompt_tokens, response.usage.completion_tokens)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=HELLO,
            max_tokens=9,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=EXACT,
        )
        chunks = list(raw.parse())
        usage = chunks[-1].usage
        expected[raw.headers["x-request-id"]] = (
            tenant,
            usage.prompt_tokens,
            usage.completion_tokens,
        )
        # A client that did not ask for usage gets none, but is still metered.
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME,
            messages=HELLO,
            max_tokens=5,
            stream=True,
            extra_body=EXACT,
        )
        chunks = list(raw.parse())
        assert all(chunk.usage is None for chunk in chunks)
        assert chunks[-1].choices[0].finish_reason == "length"
        expected[raw.headers["x-request-id"]] = (tenant, usage.prompt_tokens, 5)

    records = wait_for_records(list(expected))
    for request_id, (tenant, prompt, completion) in expected.items():
        record = records[request_id]
        assert record.tenant_id == fleet.tenants[tenant].pk
        assert (record.prompt_tokens, record.completion_tokens) == (prompt, completion)
        assert record.status == "ok" and record.http_status == 200
        assert record.replica_id == fleet.replicas["alpha"].pk
        assert record.queue_ms is not None and record.ttft_ms is not None
        assert record.generation_ms is not None
        assert record.received_at <= record.sent_at <= record.first_token_at <= record.ended_at
    assert sorted(r.completion_tokens for r in records.values()) == [5, 5, 7, 7, 9, 9]


def test_client_abort_mid_stream_is_billed_up_to_the_last_chunk(fleet, vllm):
    # 4,000 tokens take vLLM-CPU about 3 s here (0.8 ms a token): longer
    # than the gateway needs to see the client go, even paused for a second.
    LONG = 4000
    fleet.model.max_context_tokens = MAX_POSITIONS
    fleet.model.save(update_fields=["max_context_tokens"])
    fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    before = generation_tokens_total(vllm["alpha"].base_url)
    began = time.time()
    with hold_stream(fleet.gateway, fleet.secrets["a"], max_tokens=LONG) as request_id:
        time.sleep(0.2)  # a few more tokens, then the client goes away
    record = wait_for_records([request_id])[request_id]
    assert record.status == "aborted"
    assert record.http_status == 499
    assert 0 < record.completion_tokens < LONG
    assert record.prompt_tokens > 0
    time.sleep(1.0)
    generated = generation_tokens_total(vllm["alpha"].base_url) - before
    froze = gateway_froze(fleet.gateway, since=began, longer_than_ms=500)
    assert generated < LONG, f"vLLM kept generating after the client went away (stalls: {froze})"
    # What vLLM generated beyond our last relayed chunk is at most a short tail.
    assert generated >= record.completion_tokens


def test_priority_class_reaches_vllm(fleet, vllm):
    """On a replica that runs one sequence at a time, a critical tenant's
    request overtakes a batch tenant's requests that were queued before it
    (first come, first served would finish it last)."""
    fleet.add_tenant("batch", priority_class="batch")
    fleet.add_tenant("critical", priority_class="critical")
    fleet.add_replica("lab", vllm["lab"].base_url, "shared")
    fleet.ready()
    # Generous: the assertion is about order, not speed, and a loaded CI
    # machine can be many times slower than a quiet one.
    clients = {t: fleet.client(t, timeout=300) for t in ("batch", "critical")}

    def call(tenant: str):
        return chat(clients[tenant], max_tokens=150)[0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        lows = [pool.submit(call, "batch") for _ in range(5)]
        # One batch request runs (150 tokens: a few tenths of a second), the
        # others wait in vLLM's queue. (vLLM's waiting gauge lags too much to
        # poll for this.) Batch requests that reach vLLM after the critical
        # one wait longer than it anyway.
        time.sleep(0.3)
        high = pool.submit(call, "critical")
        ids = [f.result() for f in [*lows, high]]
    records = wait_for_records(ids)
    high_queue = records[ids[-1]].queue_ms
    # vLLM's own queue time: first come, first served would make the critical
    # request wait for every batch request queued before it.
    overtaken = [i for i in ids[:-1] if records[i].queue_ms > high_queue]
    assert len(overtaken) >= 2, [(records[i].priority, records[i].queue_ms) for i in ids]
    assert records[ids[-1]].priority == 0
    assert {records[i].priority for i in ids[:-1]} == {100}


def test_cache_salt_isolates_tenants_prefix_cache(fleet, vllm):
    fleet.add_tenant("a")
    fleet.add_tenant("b")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    secret_prompt = [{"role": "user", "content": "tenant A's confidential prefix " * 30}]
    _, first = chat(fleet.client("a"), max_tokens=2, messages=secret_prompt)
    _, again = chat(fleet.client("a"), max_tokens=2, messages=secret_prompt)
    _, probe = chat(fleet.client("b"), max_tokens=2, messages=secret_prompt)
    assert first.usage.prompt_tokens > 512
    assert again.usage.prompt_tokens_details.cached_tokens >= 512  # A warms its own cache
    assert probe.usage.prompt_tokens_details.cached_tokens == 0  # B cannot hit it


def test_over_limit_is_429_naming_the_limit(fleet, vllm):
    # A queue timeout of 0: over its concurrency limit, a request is refused
    # at once instead of waiting (tests/gateway/test_gateway_fair_queue.py).
    fleet.add_tenant("single", max_concurrent_requests=1, queue_timeout_ms=0)
    fleet.add_tenant("slow", requests_per_minute=2)
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    client = fleet.client("single")  # made before the stream is held
    with hold_stream(fleet.gateway, fleet.secrets["single"]) as held:
        with pytest.raises(openai.RateLimitError) as refused:
            chat(client)
        # Still held once vLLM has generated all of it: the relay waits on
        # the client, so the test holds for as long as it needs.
        deadline = time.monotonic() + 60
        while vllm_metric(vllm["alpha"].base_url, "num_requests_running") > 0:
            assert time.monotonic() < deadline, "vLLM never finished the held stream"
            time.sleep(0.2)
        with pytest.raises(openai.RateLimitError):
            chat(client)
    assert "concurrent requests" in refused.value.message
    assert refused.value.response.headers["retry-after"] == "1"
    assert refused.value.body["code"] == "max_concurrent_requests"
    wait_for_records([held])  # the gateway saw the stream end and released it
    chat(client)  # admitted again

    chat(fleet.client("slow"))
    chat(fleet.client("slow"))
    with pytest.raises(openai.RateLimitError) as refused:
        chat(fleet.client("slow"))
    assert "requests per minute" in refused.value.message
    # Two requests fill a limit of 2 in this minute (or straddle two): the
    # next fits once the window weighs them at most 1, within 90 s.
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 90
    rejected_id = refused.value.response.headers["x-request-id"]
    record = wait_for_records([rejected_id])[rejected_id]
    assert (record.status, record.http_status) == ("rejected", 429)
    assert record.tenant_id == fleet.tenants["slow"].pk
    assert UsageEvent.objects.filter(tenant=fleet.tenants["slow"], status="ok").count() == 2


def test_limits_hold_across_two_gateway_processes(fleet, vllm, tmp_path):
    url = redis_url()
    require(url is not None, "no Redis for cluster-wide limits")
    fleet.add_tenant("single", max_concurrent_requests=1, queue_timeout_ms=0)
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    env = {"REDIS_URL": url, "GATEWAY_REDIS_PREFIX": f"test-{time.time_ns()}"}
    first, first_url = start_gateway(env=env)
    second, second_url = start_gateway(env=env)
    http = httpx.Client(timeout=30)  # made before the stream is held

    def via_second_gateway() -> httpx.Response:
        return http.post(
            f"{second_url}/v1/chat/completions",
            headers={"Authorization": f"Bearer {fleet.secrets['single']}"},
            json={"model": MODEL_NAME, "messages": HELLO, "max_tokens": 3},
        )

    try:
        fleet.ready()
        time.sleep(0.5)  # both gateways loaded the fleet
        # Warm the second gateway (key lookup, database connection) first: a
        # cold first request can take longer than the held stream lasts.
        assert via_second_gateway().status_code == 200
        with hold_stream(first_url, fleet.secrets["single"]) as held:
            response = via_second_gateway()
            assert response.status_code == 429
            assert response.json()["error"]["code"] == "max_concurrent_requests"
        wait_for_records([held])  # the first gateway released the lease in Redis
        assert via_second_gateway().status_code == 200
    finally:
        http.close()
        stop_gateway(first)
        stop_gateway(second)


def test_dedicated_tenant_uses_its_replica_then_spills_to_shared(fleet, vllm):
    fleet.add_tenant("owner")
    fleet.add_tenant("neighbour")
    fleet.add_replica(
        "alpha",
        vllm["alpha"].base_url,
        "owner-dedicated",
        kind=PoolKind.DEDICATED,
        owner="owner",
        max_inflight=1,
    )
    fleet.add_replica("beta", vllm["beta"].base_url, "shared")
    fleet.ready()
    owner = fleet.client("owner")
    with hold_stream(fleet.gateway, fleet.secrets["owner"]) as held:
        spilled, _ = chat(owner)
    wait_for_records([held])  # the dedicated replica is free again
    quiet, _ = chat(owner)
    neighbour_ids = [chat(fleet.client("neighbour"))[0] for _ in range(3)]
    records = wait_for_records([held, spilled, quiet, *neighbour_ids])
    alpha, beta = fleet.replicas["alpha"].pk, fleet.replicas["beta"].pk
    assert records[held].replica_id == alpha
    assert records[held].pool_id == fleet.pools["owner-dedicated"].pk
    assert records[spilled].replica_id == beta  # the dedicated replica was saturated
    assert records[spilled].pool_id == fleet.pools["shared"].pk
    assert records[quiet].replica_id == alpha  # back home once it is free
    assert {records[i].replica_id for i in neighbour_ids} == {beta}  # never on A's GPUs
    models = fleet.client("neighbour").models.list()
    assert [m.id for m in models.data] == [MODEL_NAME]


def test_revoked_key_is_refused_within_the_cache_window(fleet, vllm):
    tenant = fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    chat(fleet.client("a"))
    key = tenant.api_keys.get()
    api_key_revoke(tenant=tenant, key_id=key.pk)
    time.sleep(1.5)  # the test gateway caches keys for 1 s
    with pytest.raises(openai.AuthenticationError) as refused:
        chat(fleet.client("a"))
    assert "revoked" in refused.value.message


def test_a_killed_replica_is_routed_around(fleet, vllm):
    """Runs last in this module: it kills the `beta` replica."""
    fleet.add_tenant("a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.add_replica("beta", vllm["beta"].base_url, "shared")
    fleet.ready()
    replica_stop(vllm["beta"].pid, timeout=5)
    ids = [chat(fleet.client("a"))[0] for _ in range(6)]
    records = wait_for_records(ids)
    assert all(r.status == "ok" for r in records.values())
    assert {r.replica_id for r in records.values()} == {fleet.replicas["alpha"].pk}


def test_scraper_reads_a_real_replica(fleet, vllm):
    from serving.scraper import replica_scrape

    fleet.add_tenant("a")
    replica = fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    before = replica_scrape(replica=replica)
    _, response = chat(fleet.client("a"), max_tokens=6)
    after = replica_scrape(replica=replica)
    assert after.up and after.requests_running == 0
    assert after.generation_tokens_total - before.generation_tokens_total == 6
    assert after.prompt_tokens_total - before.prompt_tokens_total == response.usage.prompt_tokens


def test_replicas_run_niced_as_whole_sessions(vllm):
    """A replica runs in its own session: with autogroup scheduling its nice
    counts only if the session's group carries it, else it takes a CPU
    from the gateway beside it (see serving.launcher.session_nice)."""
    autogroup = Path(f"/proc/{vllm['alpha'].pid}/autogroup")
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("no autogroup scheduling in this kernel")
    assert autogroup.read_text().split()[-1] == str(ENGINE_NICE)
