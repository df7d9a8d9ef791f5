"""Gateway behaviour that needs a replica misbehaving on demand: a fake
upstream records what was forwarded, answers 500, hangs, or dies mid-stream.
A real vLLM replica stands beside it where a retry must succeed."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from metering.models import UsageEvent
from serving.choices import PoolKind
from serving.models import LoraAdapter
from serving.tiny_model import MODEL_NAME
from tests.fleet import (
    gateway_metrics_text,
    metric_samples,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records,
    wait_for_records_written,
)

HELLO = [{"role": "user", "content": "hello"}]


def test_gateway_sets_what_the_client_must_not(fleet, fake):
    fleet.add_tenant("a", priority_class="high")
    fleet.add_tenant("b", priority_class="batch")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    raw = fleet.client("a").chat.completions.with_raw_response.create(
        model=MODEL_NAME,
        messages=HELLO,
        max_tokens=3,
        extra_body={"priority": -100, "cache_salt": "forged", "request_id": "mine"},
    )
    fleet.client("b").chat.completions.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=3, stream=True
    ).close()
    sent_a, sent_b = fake.requests
    assert sent_a["body"]["priority"] == 10  # the tenant's class, not the client's -100
    assert sent_b["body"]["priority"] == 100
    assert sent_a["body"]["cache_salt"] not in ("forged", sent_b["body"]["cache_salt"])
    assert len(sent_a["body"]["cache_salt"]) == 32
    assert "request_id" not in sent_a["body"]
    assert sent_a["headers"]["x-request-id"] == raw.headers["x-request-id"]
    assert sent_b["body"]["stream_options"] == {
        "include_usage": True,
        "continuous_usage_stats": True,
    }


def test_lora_adapters_are_private_to_their_tenant(fleet, fake):
    owner = fleet.add_tenant("owner")
    fleet.add_tenant("other")
    fleet.add_replica("fake", fake.base_url, "shared")
    LoraAdapter.objects.create(
        name="owner-support-bot", tenant=owner, base_model=fleet.model, upstream_name="lora-7"
    )
    fleet.ready()
    fleet.client("owner").chat.completions.create(model="owner-support-bot", messages=HELLO)
    assert fake.requests[-1]["body"]["model"] == "lora-7"
    with pytest.raises(openai.NotFoundError) as refused:
        fleet.client("other").chat.completions.create(model="owner-support-bot", messages=HELLO)
    assert refused.value.body["code"] == "model_not_found"
    assert len(fake.requests) == 1  # nothing reached a replica
    assert [m.id for m in fleet.client("owner").models.list()] == [MODEL_NAME, "owner-support-bot"]
    assert [m.id for m in fleet.client("other").models.list()] == [MODEL_NAME]


def _own_fake_then_shared_vllm(fleet, fake, vllm, mode: str) -> None:
    """The tenant's own (fake) replica is tried first; it fails before
    anything was streamed, so the request must be retried on the shared one."""
    fake.mode = mode
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "mine", kind=PoolKind.DEDICATED, owner="a")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")


def _assert_served_by_alpha(fleet, fake, raw) -> None:
    assert raw.parse().usage.completion_tokens >= 1
    request_id = raw.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert record.status == "ok"
    assert record.replica_id == fleet.replicas["alpha"].pk
    assert len(fake.requests) == 1


def test_a_replica_answering_500_is_retried_once_on_another(fleet, fake, vllm):
    _own_fake_then_shared_vllm(fleet, fake, vllm, "error500")
    fleet.ready()
    raw = fleet.client("a", timeout=60).chat.completions.with_raw_response.create(
        model=MODEL_NAME, messages=HELLO, max_tokens=4
    )
    _assert_served_by_alpha(fleet, fake, raw)


def test_a_silent_replica_is_retried_once_on_another(fleet, fake, vllm):
    """A gateway of its own with a 3 s first-byte timeout (the shared one waits
    longer, as a busy non-streaming replica legitimately sends nothing for a while)."""
    _own_fake_then_shared_vllm(fleet, fake, vllm, "hang")
    proc, url = start_gateway(env={"GATEWAY_UPSTREAM_FIRST_BYTE_TIMEOUT": "3"})
    try:
        wait_for_fleet(url, replicas=2)
        client = openai.OpenAI(
            base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0, timeout=60
        )
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL_NAME, messages=HELLO, max_tokens=4
        )
        _assert_served_by_alpha(fleet, fake, raw)
    finally:
        stop_gateway(proc)


def test_no_replica_left_is_a_clean_503_that_says_when_to_retry(fleet, fake):
    fake.mode = "error500"
    tenant = fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    client = openai.OpenAI(
        base_url=f"{fleet.gateway}/v1", api_key=fleet.secrets["a"], max_retries=1
    )
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=MODEL_NAME, messages=HELLO)
    assert failed.value.status_code == 503
    assert failed.value.body["code"] == "no_replica"
    assert failed.value.response.headers["retry-after"] == "1"  # the fleet is read again by then
    request_id = failed.value.response.headers["x-request-id"]
    record = wait_for_records([request_id])[request_id]
    assert (record.status, record.http_status) == ("error", 503)
    # The client waited as told and asked once more, and was refused again.
    wait_for_records_written(fleet.gateway)
    statuses = UsageEvent.objects.filter(tenant=tenant).values_list("http_status", flat=True)
    assert list(statuses) == [503, 503]


def test_a_replica_dying_mid_stream_ends_cleanly_and_keeps_partial_usage(fleet, fake):
    fake.mode = "drop_midstream"
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    with (
        httpx.Client(timeout=30) as http,
        http.stream(
            "POST",
            f"{fleet.gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {fleet.secrets['a']}"},
            json={"model": MODEL_NAME, "messages": HELLO, "stream": True},
        ) as response,
    ):
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
        request_id = response.headers["x-request-id"]
    assert response.status_code == 200
    assert len(events) == 4  # three tokens, then the error
    error = json.loads(events[-1])["error"]
    assert error["code"] == "upstream_failed"
    assert all("usage" not in json.loads(e) for e in events[:-1])  # not asked for
    record = wait_for_records([request_id])[request_id]
    assert (record.status, record.http_status) == ("error", 502)
    assert (record.prompt_tokens, record.completion_tokens) == (7, 3)


class TestBadRequests:
    @pytest.fixture(autouse=True)
    def setup(self, fleet, fake):
        self.fleet = fleet
        fleet.add_tenant("a")
        fleet.add_replica("fake", fake.base_url, "shared")
        fleet.ready()
        self.url = f"{fleet.gateway}/v1/chat/completions"
        self.headers = {"Authorization": f"Bearer {fleet.secrets['a']}"}

    @pytest.mark.parametrize(
        ("body", "status", "param"),
        [
            (b"{not json", 400, None),
            (b"[1, 2]", 400, None),
            (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
            (b'{"model": "tiny-llama", "messages": []}', 400, "messages"),
            (
                b'{"model": "tiny-llama", "messages": [{"role":"user","content":"x"}], '
                b'"max_tokens": -1}',
                400,
                "max_tokens",
            ),
            (
                b'{"model": "tiny-llama", "messages": [{"role":"user","content":"x"}], '
                b'"stream": "yes"}',
                400,
                "stream",
            ),
            (
                b'{"model": "tiny-llama", "messages": [{"role":"user","content":"x"}], "n": 0}',
                400,
                "n",
            ),
            (
                b'{"model": "tiny-llama", "messages": [{"role":"user","content":"x"}], '
                b'"best_of": "2"}',
                400,
                "best_of",
            ),
            (b'{"model": "nope", "messages": [{"role":"user","content":"x"}]}', 404, "model"),
        ],
    )
    def test_rejected_with_openai_shaped_error_naming_the_param(self, body, status, param):
        response = httpx.post(self.url, content=body, headers=self.headers, timeout=10)
        assert response.status_code == status
        error = response.json()["error"]
        assert error["param"] == param
        assert error["message"]
        request_id = response.headers["x-request-id"]
        record = wait_for_records([request_id])[request_id]
        assert (record.status, record.http_status) == ("rejected", status)

    def test_an_unknown_model_is_recorded_under_the_name_asked_for(self):
        """Not as an empty model: the ledger shows what each client asked
        for, under its own tenant, cut to the ledger's 200 characters."""
        self.fleet.add_tenant("b")
        asked = [("a", "no-such-model"), ("a", "m" * 300), ("b", "gpt-5")]
        ids = []
        for tenant, model in asked:
            response = httpx.post(
                self.url,
                json={"model": model, "messages": HELLO},
                headers={"Authorization": f"Bearer {self.fleet.secrets[tenant]}"},
                timeout=10,
            )
            assert response.status_code == 404
            assert response.json()["error"]["code"] == "model_not_found"
            ids.append(response.headers["x-request-id"])
        records = wait_for_records(ids)
        assert [(records[i].tenant_id, records[i].model) for i in ids] == [
            (self.fleet.tenants["a"].pk, "no-such-model"),
            (self.fleet.tenants["a"].pk, "m" * 200),
            (self.fleet.tenants["b"].pk, "gpt-5"),
        ]
        assert all(
            (r.status, r.http_status, r.served_model_id) == ("rejected", 404, None)
            for r in records.values()
        )

    def test_a_bad_field_is_recorded_under_the_model_asked_for(self):
        response = httpx.post(
            self.url,
            json={"model": MODEL_NAME, "messages": HELLO, "max_tokens": -1},
            headers=self.headers,
            timeout=10,
        )
        assert response.status_code == 400
        request_id = response.headers["x-request-id"]
        record = wait_for_records([request_id])[request_id]
        assert (record.model, record.status, record.http_status) == (MODEL_NAME, "rejected", 400)

    @pytest.mark.parametrize(
        ("header", "code"),
        [
            (None, "missing_api_key"),
            ("Basic abc", "invalid_api_key"),
            ("Bearer glk_nope", "invalid_api_key"),
        ],
    )
    def test_bad_credentials_are_401_and_not_recorded(self, header, code):
        headers = {"Authorization": header} if header else {}
        response = httpx.post(
            self.url, json={"model": MODEL_NAME, "messages": HELLO}, headers=headers, timeout=10
        )
        assert response.status_code == 401
        assert response.json()["error"]["code"] == code
        assert not UsageEvent.objects.filter(request_id=response.headers["x-request-id"])


def test_graceful_stop_flushes_every_record(fleet, fake):
    """Records buffered in memory when the gateway gets SIGTERM are written."""
    fleet.add_tenant("a")
    fleet.add_replica("fake", fake.base_url, "shared")
    proc, url = start_gateway(
        env={"GATEWAY_RECORD_FLUSH_SECONDS": "3600", "GATEWAY_RECORD_FLUSH_MAX": "100000"}
    )
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=fleet.secrets["a"], max_retries=0)
        ids = [
            client.chat.completions.with_raw_response.create(
                model=MODEL_NAME, messages=HELLO
            ).headers["x-request-id"]
            for _ in range(25)
        ]
        assert not UsageEvent.objects.filter(request_id__in=ids).exists()  # still buffered
    finally:
        stop_gateway(proc)
    assert UsageEvent.objects.filter(request_id__in=ids).count() == 25


def test_gateway_metrics_count_requests_and_tokens_per_tenant(fleet, fake):
    fleet.add_tenant("a")
    fleet.add_tenant("b")
    fleet.add_replica("fake", fake.base_url, "shared")
    fleet.ready()
    for _ in range(2):
        fleet.client("a").chat.completions.create(model=MODEL_NAME, messages=HELLO)
    with pytest.raises(openai.NotFoundError):
        fleet.client("b").chat.completions.create(model="no-such-model", messages=HELLO)
    text = gateway_metrics_text(fleet.gateway)
    a, b = fleet.tenants["a"].slug, fleet.tenants["b"].slug
    samples = metric_samples(text)
    ok = (("model", MODEL_NAME), ("status", "ok"), ("tenant", a))
    assert samples[("gateway_requests_total", ok)] == 2
    # A model the client made up never becomes a label (unbounded cardinality).
    rejected = (("model", "unknown"), ("status", "rejected"), ("tenant", b))
    assert samples[("gateway_requests_total", rejected)] == 1
    completion = (("kind", "completion"), ("model", MODEL_NAME), ("tenant", a))
    assert samples[("gateway_tokens_total", completion)] > 0
    assert samples[("gateway_request_seconds_count", (("model", MODEL_NAME),))] >= 2
