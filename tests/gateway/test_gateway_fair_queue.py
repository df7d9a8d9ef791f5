"""Fair queuing through the real gateway process, in front of a fake slow
replica: flow control per replica, a light tenant dispatched ahead of a
heavy tenant's earlier backlog, budgets that queue instead of refusing,
queue timeout and bound (429s naming them), a client that leaves while
queued (nothing sent upstream, nothing billed), the queue's metrics, slots
shared by two gateways through Redis, and pass-through when it is off.
The end-to-end version through real vLLM is the fairness benchmark's."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal

import httpx
import openai
import pytest

from metering.models import UsageEvent
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    GatewayUrl,
    gateway_metrics,
    gateway_worker,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records,
)
from tests.gateway.fake_upstream import FakeUpstream
from tests.services import redis_url, require


def post(
    gateway: str,
    secret: str,
    text: str = "hello",
    *,
    timeout: float = 30,
    max_tokens: int = 5,
    stream: bool = False,
) -> httpx.Response:
    with httpx.Client(timeout=timeout) as http:
        return http.post(
            f"{gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {secret}"},
            json={
                "model": MODEL_NAME,
                "messages": [{"role": "user", "content": text}],
                "max_tokens": max_tokens,
                "stream": stream,
            },
        )


def metrics(gateway: GatewayUrl) -> dict[tuple, float]:
    return gateway_metrics(gateway)


def queue_depth(gateway: GatewayUrl, priority_class: str = "normal") -> float:
    return metrics(gateway)[("gateway_queue_depth", (("priority_class", priority_class),))]


def wait_until(condition, *, timeout: float = 10, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def sent_texts(fake: FakeUpstream) -> list[str]:
    return [r["body"]["messages"][0]["content"] for r in fake.requests]


def test_a_replica_gets_at_most_its_max_inflight_and_the_rest_wait(fleet, fake):
    fake.delay = 0.3
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=2)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=6) as pool:
        responses = list(pool.map(lambda _: post(fleet.gateway, fleet.secrets["a"]), range(6)))
    assert [r.status_code for r in responses] == [200] * 6
    assert fake.inflight_max == 2
    ids = [r.headers["x-request-id"] for r in responses]
    records = wait_for_records(ids)
    waits = sorted(records[i].gateway_queue_ms for i in ids)
    assert waits[:2] == [Decimal("0.000")] * 2  # dispatched at once
    assert waits[-1] >= Decimal(400)  # the last two waited for two rounds of 0.3 s
    samples = metrics(fleet.gateway)
    assert samples[("gateway_queue_seconds_count", (("priority_class", "normal"),))] >= 6
    assert samples[("gateway_replica_outstanding", (("replica", "fake"),))] == 0
    assert queue_depth(fleet.gateway) == 0


def test_a_light_tenant_goes_ahead_of_an_earlier_heavy_backlog(fleet, fake):
    """One slot; the heavy tenant's six requests arrive first. First come,
    first served would send the light tenant's request last; the fair
    queue sends it as soon as the heavy tenant has had its turn."""
    fake.delay = 0.25
    fake.usage_as_asked = True
    fake.held = True  # the first request holds the slot while the queue is read
    fleet.add_tenant("heavy")
    fleet.add_tenant("light")
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=1)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=7) as pool:
        heavy = [
            pool.submit(post, fleet.gateway, fleet.secrets["heavy"], "heavy " * 50, max_tokens=200)
            for _ in range(6)
        ]
        wait_until(lambda: queue_depth(fleet.gateway) == 5, what="the heavy backlog")
        queue = gateway_worker(fleet.gateway)["queue"]
        assert queue["waiting_by_class"]["normal"] == 5
        assert queue["replicas"] == {"fake": {"slots": 1, "outstanding": 1, "waiting": 5}}
        light = pool.submit(post, fleet.gateway, fleet.secrets["light"], "light", max_tokens=5)
        wait_until(lambda: queue_depth(fleet.gateway) == 6, what="the light request queued")
        fake.release()
        responses = [f.result() for f in [*heavy, light]]
    assert [r.status_code for r in responses] == [200] * 7
    order = sent_texts(fake)
    assert order.index("light") <= 2, order  # FIFO: 6
    light_id = responses[-1].headers["x-request-id"]
    record = wait_for_records([light_id])[light_id]
    assert record.gateway_queue_ms < Decimal(1000)  # FIFO: about 6 x 0.25 s


def test_a_flood_leaves_headroom_for_another_tenants_first_request(fleet, fake):
    """16 slots: the flooding tenant may hold 15 (GATEWAY_SLOT_HEADROOM 1/16);
    a light tenant's request starts at once instead of waiting for one of
    the flood's requests to end."""
    fake.delay = 1.0
    fleet.add_tenant("heavy")
    fleet.add_tenant("light")
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=16)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=21) as pool:
        heavy = [pool.submit(post, fleet.gateway, fleet.secrets["heavy"]) for _ in range(20)]
        wait_until(lambda: queue_depth(fleet.gateway) == 5, what="the heavy backlog")
        assert fake.inflight == 15
        light = post(fleet.gateway, fleet.secrets["light"], "light")
        assert all(f.result().status_code == 200 for f in heavy)
    assert light.status_code == 200
    light_id = light.headers["x-request-id"]
    assert wait_for_records([light_id])[light_id].gateway_queue_ms < Decimal(100)
    assert fake.inflight_max == 16


def test_over_the_concurrency_limit_a_request_waits_then_runs(fleet, fake):
    fake.delay = 0.4
    fleet.add_tenant("single", max_concurrent_requests=1)
    fleet.add_tenant("never_waits", max_concurrent_requests=1, queue_timeout_ms=0)
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with ThreadPoolExecutor(max_workers=2) as pool:
        responses = list(pool.map(lambda _: post(fleet.gateway, fleet.secrets["single"]), [0, 1]))
    assert [r.status_code for r in responses] == [200, 200]
    assert fake.inflight_max == 1  # one at a time: the limit still holds
    ids = [r.headers["x-request-id"] for r in responses]
    records = wait_for_records(ids)
    assert max(records[i].gateway_queue_ms for i in ids) >= Decimal(300)
    assert all(records[i].status == "ok" for i in ids)

    # A queue timeout of 0: refused at once, as before queuing.
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(post, fleet.gateway, fleet.secrets["never_waits"])
        wait_until(lambda: fake.inflight == 1, what="the first request upstream")
        started = time.monotonic()
        refused = post(fleet.gateway, fleet.secrets["never_waits"])
        assert time.monotonic() - started < 0.3
        assert first.result().status_code == 200
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "max_concurrent_requests"
    assert refused.headers["retry-after"] == "1"


def test_over_the_concurrency_limit_past_the_queue_timeout_is_429_naming_the_limit(fleet, fake):
    fake.delay = 1.5
    fleet.add_tenant("single", max_concurrent_requests=1, queue_timeout_ms=300)
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(post, fleet.gateway, fleet.secrets["single"])
        wait_until(lambda: fake.inflight == 1, what="the first request upstream")
        started = time.monotonic()
        refused = post(fleet.gateway, fleet.secrets["single"])
        waited = time.monotonic() - started
        assert held.result().status_code == 200
    assert 0.3 <= waited < 1.2
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "max_concurrent_requests"
    assert "concurrent requests (limit 1)" in error["message"]
    assert refused.headers["retry-after"] == "1"
    request_id = refused.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert (record.status, record.http_status) == ("rejected", 429)
    assert Decimal(250) <= record.gateway_queue_ms < Decimal(1200)


def test_queue_timeout_is_429_with_retry_after(fleet, fake):
    fake.delay = 1.5
    fleet.add_tenant("busy")
    fleet.add_tenant("patient_for_300ms", queue_timeout_ms=300)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=1)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(post, fleet.gateway, fleet.secrets["busy"])
        wait_until(lambda: fake.inflight == 1, what="the slot taken")
        refused = post(fleet.gateway, fleet.secrets["patient_for_300ms"])
        assert held.result().status_code == 200
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "queue_timeout"
    assert error["type"] == "rate_limit_error"
    assert "queue timeout (0.3s" in error["message"]
    assert refused.headers["retry-after"] == "1"
    assert sent_texts(fake) == ["hello"]  # only the busy tenant's request went upstream
    request_id = refused.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert (record.status, record.http_status, record.replica_id) == ("rejected", 429, None)
    assert record.gateway_queue_ms >= Decimal(250)  # 0.3 s, by a timer that may fire a little early


def test_over_the_queue_bound_is_429_naming_it(fleet, fake):
    fake.delay = 1.0
    fleet.add_tenant("a", max_queued_requests=1)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=1)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=2) as pool:
        running = pool.submit(post, fleet.gateway, fleet.secrets["a"])
        wait_until(lambda: fake.inflight == 1, what="the slot taken")
        queued = pool.submit(post, fleet.gateway, fleet.secrets["a"])
        wait_until(lambda: queue_depth(fleet.gateway) == 1, what="one request queued")
        started = time.monotonic()
        refused = post(fleet.gateway, fleet.secrets["a"])
        assert time.monotonic() - started < 0.5  # at once, not after a wait
        assert [running.result().status_code, queued.result().status_code] == [200, 200]
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert error["code"] == "queue_full"
    assert "max_queued_requests 1" in error["message"]
    assert refused.headers["retry-after"] == "1"


def test_a_request_that_can_never_fit_the_token_budget_is_400_at_once(fleet, fake):
    fleet.add_tenant("small", max_inflight_tokens=100)
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    refused = post(fleet.gateway, fleet.secrets["small"], max_tokens=500)
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert (error["code"], error["param"]) == ("max_inflight_tokens", "max_tokens")
    assert post(fleet.gateway, fleet.secrets["small"], max_tokens=50).status_code == 200


@pytest.mark.parametrize("fair_queuing", ["true", "false"])
def test_what_no_wait_can_admit_is_400_and_the_openai_client_does_not_retry_it(
    fleet, fake, fair_queuing
):
    """More than the tenant's whole in-flight budget or tokens-per-minute
    limit, or max_tokens that fill the model's context: 400 naming the
    field, with or without fair queuing, so the official client (which
    retries 429s by itself) asks once."""
    tenant = fleet.add_tenant("small", max_inflight_tokens=100)
    minute = fleet.add_tenant("per-minute", tokens_per_minute=200)
    fleet.add_replica("fake", fake.base_url, "shared")
    proc, url = start_gateway(env={"GATEWAY_FAIR_QUEUING": fair_queuing})
    try:
        wait_for_fleet(url, replicas=1)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["small"], max_retries=2)
        ask = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}]}
        with pytest.raises(openai.BadRequestError) as budget:
            client.chat.completions.create(**ask, max_tokens=500)
        assert (budget.value.body["code"], budget.value.body["param"]) == (
            "max_inflight_tokens",
            "max_tokens",
        )
        assert "over the tenant's limit of 100" in budget.value.body["message"]
        with pytest.raises(openai.BadRequestError) as context:
            client.chat.completions.create(**ask, max_completion_tokens=10_000_000)
        assert context.value.body["param"] == "max_completion_tokens"
        assert "context window of 2,048 tokens" in context.value.body["message"]
        ok = client.chat.completions.with_raw_response.create(**ask, max_tokens=50)
        assert ok.parse().usage.completion_tokens == 3
        per_minute = openai.OpenAI(
            base_url=f"{url}/v1", api_key=fleet.secrets["per-minute"], max_retries=2
        )
        with pytest.raises(openai.BadRequestError) as rate:
            per_minute.chat.completions.create(**ask, max_completion_tokens=250)
        assert (rate.value.body["code"], rate.value.body["param"]) == (
            "tokens_per_minute",
            "max_completion_tokens",
        )
        assert "over the tenant's limit of 200" in rate.value.body["message"]
        refused = [budget.value.response, context.value.response, rate.value.response]
        ids = [r.headers["x-request-id"] for r in refused]
        records = wait_for_records([*ids, ok.headers["x-request-id"]])
        assert [records[i].http_status for i in ids] == [400, 400, 400]
        # Asked once each: no retry reached the gateway, nothing reached vLLM.
        assert UsageEvent.objects.filter(tenant=tenant).count() == 3
        assert UsageEvent.objects.filter(tenant=minute).count() == 1
        assert len(fake.requests) == 1
    finally:
        stop_gateway(proc)


def test_a_client_that_leaves_while_queued_is_not_sent_and_not_billed(fleet, fake):
    fake.delay = 1.5
    fleet.add_tenant("busy")
    leaver = fleet.add_tenant("leaver")
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=1)
    fleet.ready()
    with ThreadPoolExecutor(max_workers=1) as pool:
        held = pool.submit(post, fleet.gateway, fleet.secrets["busy"])
        wait_until(lambda: fake.inflight == 1, what="the slot taken")
        with pytest.raises(httpx.ReadTimeout):
            post(fleet.gateway, fleet.secrets["leaver"], "gone", timeout=0.4)
        # It left the queue at once: nobody waits while the slot is still taken.
        wait_until(lambda: queue_depth(fleet.gateway) == 0, timeout=0.5, what="an empty queue")
        assert fake.inflight == 1
        assert held.result().status_code == 200
    assert "gone" not in sent_texts(fake)
    wait_until(lambda: UsageEvent.objects.filter(tenant=leaver).exists(), what="its record")
    record = UsageEvent.objects.get(tenant=leaver)
    assert (record.status, record.http_status) == ("rejected", 499)
    assert record.replica_id is None  # ran nowhere: no GPU time attributed
    assert (record.prompt_tokens, record.cached_tokens, record.completion_tokens) == (0, 0, 0)
    assert record.gateway_queue_ms >= Decimal(300)
    # The slot it would have had is free: the next request runs at once.
    fake.delay = 0
    response = post(fleet.gateway, fleet.secrets["leaver"], "back")
    assert response.status_code == 200
    request_id = response.headers["x-request-id"]
    assert wait_for_records([request_id])[request_id].gateway_queue_ms < Decimal(200)


def test_fair_queuing_off_is_pass_through(fleet, fake):
    fake.delay = 0.5
    fleet.add_tenant("a")
    fleet.add_tenant("single", max_concurrent_requests=1)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=1)
    proc, url = start_gateway(env={"GATEWAY_FAIR_QUEUING": "false"})
    try:
        wait_for_fleet(url, replicas=1)
        with ThreadPoolExecutor(max_workers=3) as pool:
            responses = list(pool.map(lambda _: post(url, fleet.secrets["a"]), range(3)))
        assert [r.status_code for r in responses] == [200] * 3
        assert fake.inflight_max == 3  # max_inflight only orders routing
        ids = [r.headers["x-request-id"] for r in responses]
        assert all(r.gateway_queue_ms is None for r in wait_for_records(ids).values())
        with ThreadPoolExecutor(max_workers=1) as pool:
            held = pool.submit(post, url, fleet.secrets["single"])
            wait_until(lambda: fake.inflight == 1, what="the first request upstream")
            refused = post(url, fleet.secrets["single"])
            assert held.result().status_code == 200
        assert refused.status_code == 429  # refused at once, no queue
        assert refused.json()["error"]["code"] == "max_concurrent_requests"
        assert ("gateway_queue_depth", (("priority_class", "normal"),)) not in metrics(url)
        health = gateway_worker(url)
        assert (health["fair_queuing"], health["queue"]) == (False, None)
    finally:
        stop_gateway(proc)


def test_two_gateways_share_slots_and_budgets_through_redis(fleet, fake):
    url = redis_url()
    require(url is not None, "no Redis for gateways sharing slots")
    fake.delay = 0.2
    fleet.add_tenant("a", queue_timeout_ms=30_000)
    fleet.add_tenant("single", max_concurrent_requests=1)
    fleet.add_replica("fake", fake.base_url, "shared", max_inflight=2)
    env = {"REDIS_URL": url, "GATEWAY_REDIS_PREFIX": f"test-{time.time_ns()}"}
    first, first_url = start_gateway(env=env)
    second, second_url = start_gateway(env=env)
    try:
        for gateway in (first_url, second_url):
            wait_for_fleet(gateway, replicas=1)
            assert post(gateway, fleet.secrets["a"]).status_code == 200  # warm
        with ThreadPoolExecutor(max_workers=12) as pool:
            responses = list(
                pool.map(
                    lambda n: post((first_url, second_url)[n % 2], fleet.secrets["a"]), range(12)
                )
            )
        assert [r.status_code for r in responses] == [200] * 12
        assert fake.inflight_max == 2  # never more than the replica's two, across gateways

        # A concurrency budget held on one gateway: the other's request waits for it.
        fake.delay = 0.6
        with ThreadPoolExecutor(max_workers=1) as pool:
            held = pool.submit(post, first_url, fleet.secrets["single"])
            wait_until(lambda: fake.inflight == 1, what="the first request upstream")
            waited = post(second_url, fleet.secrets["single"])
            assert held.result().status_code == 200
        assert waited.status_code == 200
        request_id = waited.headers["x-request-id"]
        assert wait_for_records([request_id])[request_id].gateway_queue_ms >= Decimal(300)
    finally:
        stop_gateway(first)
        stop_gateway(second)
