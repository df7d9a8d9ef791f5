"""Disaggregated serving in the ledger, as a tier the gateway does not
proxy reports it (an NVIDIA Dynamo deployment, through the ingestion API):
one request id, a row per phase, each on its own replica with its own
usage and timing; attributed on each replica, billed once, reconciled per
replica; a phase left alone a day is flagged, never dropped."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import orjson
import pytest

from metering.jobs import metering_run
from metering.models import AttributionWindow, RequestShares, UsageEvent, UsageRollup
from metering.reconciliation import reconciliation_compute
from metering.selectors.reconciliation import phases_unpaired
from metering.selectors.requests import request_device_seconds
from metering.selectors.slo import slo_figures
from serving.models import ReplicaMetricSample
from tenants.services import service_key_create
from tests.conftest import client_for_key
from tests.factories import make_finance_user
from tests.ledger import disaggregated_pair
from tests.metering.conftest import T0

URL = "/api/v1/usage/events"
PROMPT, OUTPUT = 200, 40


@pytest.fixture
def disagg(ledger):
    prefill, decode = disaggregated_pair(ledger)
    _key, secret = service_key_create(name="dynamo")
    return prefill, decode, client_for_key(secret)


def phases(ledger, prefill, decode, request_id="dyn-1", at=T0) -> list[dict]:
    """The prefill computes the prompt (and makes one token, which is not
    sent) in 60 ms; the decode reads the prompt as KV cache and generates."""
    common = {
        "request_id": request_id,
        "tenant": ledger.a.slug,
        "model": ledger.model.name,
        "received_at": at,
        "status": "ok",
    }
    return [
        common
        | {
            "phase": "prefill",
            "replica": prefill.name,
            "prompt_tokens": PROMPT,
            "completion_tokens": 1,
            "sent_at": at,
            "ended_at": at + timedelta(milliseconds=60),
            "queue_ms": 2,
            "ttft_ms": 58,
            "generation_ms": 0,
        },
        common
        | {
            "phase": "decode",
            "replica": decode.name,
            "prompt_tokens": PROMPT,
            "cached_tokens": PROMPT,
            "completion_tokens": OUTPUT,
            "sent_at": at + timedelta(milliseconds=60),
            "ended_at": at + timedelta(seconds=1),
            "queue_ms": 0,
            "ttft_ms": 40,
            "generation_ms": 900,
        },
    ]


def post(client, events):
    return client.post(URL, orjson.loads(orjson.dumps(events, default=str)), format="json")


def test_one_request_two_phases_attributed_on_each_replica_and_billed_once(ledger, disagg):
    prefill, decode, client = disagg
    response = post(client, phases(ledger, prefill, decode))
    assert response.status_code == 200, response.json()
    assert response.json()["accepted"] == 2
    assert post(client, phases(ledger, prefill, decode)).json()["duplicates"] == 2
    rows = UsageEvent.objects.filter(request_id="dyn-1").order_by("phase")
    assert [(r.phase, r.replica_id) for r in rows] == [
        ("decode", decode.pk),
        ("prefill", prefill.pk),
    ]

    metering_run(now=T0 + timedelta(hours=3))
    on = {
        w.replica_id: RequestShares.objects.get(window=w).as_seconds()
        for w in AttributionWindow.objects.filter(replica__in=[prefill, decode])
    }
    # Each phase holds its own replica for its own time: 58 ms of prefill
    # (scheduled at 2 ms), and 940 ms of decode.
    assert on == {
        prefill.pk: {"dyn-1": Decimal("0.058000000")},
        decode.pk: {"dyn-1": Decimal("0.940000000")},
    }
    # The request's own page adds up its phases' device time.
    assert request_device_seconds(tenant=ledger.a, request_id="dyn-1") == {
        T0: Decimal("0.998000000")
    }
    # Its service levels count it once (by its decode, whose first token
    # the client waited for).
    (slo,) = slo_figures(start=T0, end=T0 + timedelta(hours=1), tenant_ids=None, by_day=False)
    assert (slo["requests"], slo["failed"], slo["timed"]) == (1, 0, 1)
    rollups = UsageRollup.objects.filter(tenant=ledger.a)
    totals = [
        sum(getattr(r, name) for r in rollups)
        for name in ("prompt_tokens", "cached_tokens", "completion_tokens", "requests_ok")
    ]
    assert totals == [PROMPT, 0, OUTPUT, 1]  # what rating reads: the request, once

    # Each replica's own counters agree with its own row.
    for replica, prompt, generated in ((prefill, PROMPT, 1), (decode, PROMPT, OUTPUT)):
        for at, p, g in (
            (T0 - timedelta(seconds=5), 0, 0),
            (T0 + timedelta(seconds=5), prompt, generated),
        ):
            ReplicaMetricSample.objects.create(
                replica=replica, scraped_at=at, up=True, prompt_tokens_total=p,
                generation_tokens_total=g,
            )  # fmt: skip
        gap = reconciliation_compute(replica=replica, start=T0, end=T0 + timedelta(hours=1))
        assert (gap.prompt_gap, gap.generation_gap) == (0, 0)


@pytest.mark.parametrize(
    ("which", "fields", "reason"),
    [
        (0, {"phase": "decode"}, "serves the prefill phase, not decode"),
        (1, {"phase": "whole"}, "serves the decode phase of a disaggregated pool"),
        (1, {"phase": "both"}, "must be 'whole', 'prefill' or 'decode'"),
    ],
)
def test_a_phase_its_replica_does_not_serve_is_a_400_naming_it(
    ledger, disagg, which, fields, reason
):
    prefill, decode, client = disagg
    events = phases(ledger, prefill, decode)
    events[which] |= fields
    response = post(client, events)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == f"events.{which}.phase"
    assert reason in response.json()["results"][which]["reason"]
    assert not UsageEvent.objects.exists()


def test_a_phase_alone_after_a_day_is_flagged_never_dropped(ledger, disagg, client):
    prefill, decode, reporter = disagg
    lonely, failed, paired = (
        phases(ledger, prefill, decode, "lonely")[:1],
        [phases(ledger, prefill, decode, "failed")[0] | {"status": "error", "http_status": 500}],
        phases(ledger, prefill, decode, "paired"),
    )
    recent = phases(ledger, prefill, decode, "recent", at=T0 + timedelta(hours=20))[1:]
    assert post(reporter, lonely + failed + paired + recent).status_code == 200

    flagged = phases_unpaired(start=T0, end=T0 + timedelta(days=2), now=T0 + timedelta(days=1))
    assert [(u["request_id"], u["phase"], u["tokens"]) for u in flagged] == [
        ("lonely", "prefill", PROMPT + 1)
    ]  # the failed prefill ended its request; the recent decode may yet be joined
    later = phases_unpaired(start=T0, end=T0 + timedelta(days=3), now=T0 + timedelta(days=3))
    assert [u["request_id"] for u in later] == ["lonely", "recent"]
    assert UsageEvent.objects.filter(request_id__in=["lonely", "recent"]).count() == 2

    client.force_login(make_finance_user())
    html = client.get("/reconciliation/").content.decode()
    assert "Phases without their other half" in html
