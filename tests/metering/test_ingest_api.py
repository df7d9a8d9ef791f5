"""POST /api/v1/usage/events: service keys only, JSON or NDJSON, idempotent,
per-item results, all-or-nothing with every bad event named."""

from __future__ import annotations

from decimal import Decimal

import orjson
import pytest

from metering.models import UsageEvent
from tenants.services import service_key_create, service_key_revoke
from tests.conftest import client_for_key
from tests.factories import make_key

URL = "/api/v1/usage/events"


def as_json(event: dict) -> dict:
    return orjson.loads(orjson.dumps(event, default=str))


@pytest.fixture
def reporter(ledger):
    _key, secret = service_key_create(name="edge fleet")
    return client_for_key(secret)


def test_a_batch_is_recorded_and_a_replay_is_all_duplicates(ledger, reporter):
    events = [as_json(ledger.event("e1")), as_json(ledger.event("e2", tenant=ledger.b))]
    events[1].update(tenant=ledger.b.slug, tenant_id=None)
    response = reporter.post(URL, {"events": events}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "accepted": 2,
        "duplicates": 0,
        "results": [
            {"index": 0, "request_id": "e1", "status": "accepted"},
            {"index": 1, "request_id": "e2", "status": "accepted"},
        ],
    }
    again = reporter.post(URL, events, format="json")  # a bare array works too
    assert again.json()["duplicates"] == 2
    assert [r["status"] for r in again.json()["results"]] == ["duplicate", "duplicate"]
    assert UsageEvent.objects.filter(source="api").count() == 2


def test_ndjson_bodies(ledger, reporter):
    body = b"\n".join(orjson.dumps(as_json(ledger.event(f"n{i}"))) for i in range(3))
    response = reporter.post(URL, body, content_type="application/x-ndjson")
    assert response.status_code == 200 and response.json()["accepted"] == 3


def test_bad_events_are_named_and_nothing_is_written(ledger, reporter):
    events = [
        as_json(ledger.event("ok")),
        as_json(ledger.event("neg", prompt_tokens=-3)),
        as_json(ledger.event("who", tenant_id=None)) | {"tenant": "nobody"},
    ]
    response = reporter.post(URL, {"events": events}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["field"] == "events.1.prompt_tokens"
    assert [d["field"] for d in body["error"]["details"]] == [
        "events.1.prompt_tokens",
        "events.2.tenant",
    ]
    assert [r["status"] for r in body["results"]] == ["not_written", "rejected", "rejected"]
    assert "unknown tenant 'nobody'" in body["results"][2]["reason"]
    assert not UsageEvent.objects.exists()


def test_the_gateway_queue_time_is_accepted_and_a_negative_one_named(ledger, reporter):
    timed = as_json(ledger.event("g1")) | {"gateway_queue_ms": 12.25}
    untimed = as_json(ledger.event("g2"))  # another tier that has no gateway queue
    response = reporter.post(URL, [timed, untimed], format="json")
    assert response.status_code == 200, response.json()
    stored = dict(UsageEvent.objects.values_list("request_id", "gateway_queue_ms"))
    assert stored == {"g1": Decimal("12.250"), "g2": None}

    negative = as_json(ledger.event("g3")) | {"gateway_queue_ms": -0.5}
    refused = reporter.post(URL, [negative], format="json")
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["field"] == "events.0.gateway_queue_ms"
    assert "gateway_queue_ms" in error["message"]
    assert not UsageEvent.objects.filter(request_id="g3").exists()


def test_too_many_events_or_not_json(ledger, reporter, settings):
    settings.METERING = {**settings.METERING, "INGEST_MAX_EVENTS": 2}
    events = [as_json(ledger.event(f"x{i}")) for i in range(3)]
    too_many = reporter.post(URL, {"events": events}, format="json")
    assert too_many.status_code == 400 and too_many.json()["error"]["field"] == "events"
    garbage = reporter.post(URL, b"{nope", content_type="application/json")
    assert garbage.status_code == 400 and "not valid JSON" in garbage.json()["error"]["message"]
    assert not UsageEvent.objects.exists()


def test_only_live_service_keys_may_report(ledger, api):
    event = as_json(ledger.event("e"))
    _key, tenant_secret = make_key(ledger.a)
    assert client_for_key(tenant_secret).post(URL, [event], format="json").status_code == 403
    assert api.post(URL, [event], format="json").status_code == 401
    key, secret = service_key_create(name="old")
    service_key_revoke(key=key)
    refused = client_for_key(secret).post(URL, [event], format="json")
    assert refused.status_code == 401 and "revoked" in refused.json()["error"]["message"]
    assert not UsageEvent.objects.exists()


def test_timing_says_whose_clock_the_timeline_is(ledger, reporter):
    """A tier whose engine gives token counts only (SGLang, Triton's OpenAI
    frontend) reports its own window: the ledger row says so; one that
    sends the engine's timings is marked engine-timed without naming it."""
    engine = as_json(ledger.event("t-engine"))
    window = as_json(ledger.event("t-window", queue_ms=None, ttft_ms=None, generation_ms=None))
    window["timing"] = "gateway"
    tgi = as_json(ledger.event("t-tgi", ttft_ms=None)) | {"timing": "engine"}
    response = reporter.post(URL, [engine, window, tgi], format="json")
    assert response.status_code == 200, response.json()
    stored = dict(UsageEvent.objects.values_list("request_id", "timing"))
    assert stored == {"t-engine": "engine", "t-window": "gateway", "t-tgi": "engine"}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"timing": "gpu"}, "must be 'engine' or 'gateway'"),
        ({"timing": "gateway"}, "omit queue_ms, ttft_ms and generation_ms"),
        (
            {"timing": "engine", "queue_ms": None, "ttft_ms": None, "generation_ms": None},
            "needs the engine's queue_ms, ttft_ms or generation_ms",
        ),
    ],
)
def test_a_timing_that_contradicts_the_event_is_a_400_naming_it(ledger, reporter, fields, reason):
    response = reporter.post(URL, [as_json(ledger.event("bad") | fields)], format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["error"]["field"] == "events.0.timing"
    assert reason in body["results"][0]["reason"]
    assert not UsageEvent.objects.exists()


def test_the_web_app_reuses_its_database_connections(ledger_committed):
    """The web app under ASGI runs each request in a thread of its own: it
    takes its connection from a pool and hands it back, so twenty POSTs in
    a row leave a connection or two open, not one per request."""
    import httpx
    from django.db import connection

    from core.processes import ManagedProcess, database_url_for_subprocess, uvicorn_argv
    from tests.services import free_port

    _key, secret = service_key_create(name="pooled")
    port = free_port()
    web = ManagedProcess(
        name="web-pool",
        argv=uvicorn_argv("config.asgi:application", host="127.0.0.1", port=port),
        # Its connections, told from every other by their application name.
        env={"DATABASE_URL": database_url_for_subprocess(), "PGAPPNAME": "pooled-web"},
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    web.start()
    try:
        web.wait_ready(timeout=60)
        headers = {"Authorization": f"Bearer {secret}"}
        for n in range(20):
            body = {"events": [as_json(ledger_committed.event(f"pooled-{n}"))]}
            answer = httpx.post(f"http://127.0.0.1:{port}{URL}", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooled-web'"
            )
            (open_,) = cursor.fetchone()
    finally:
        web.stop()
    assert UsageEvent.objects.filter(request_id__startswith="pooled-").count() == 20
    assert 1 <= open_ <= 2, f"{open_} connections left open by 20 requests"
