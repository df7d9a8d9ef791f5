"""GET /api/v1/usage as a tenant and finance read it: CSV and JSON write
`period_start` in one format (ISO 8601, UTC, "Z"); requests that named no
model are a row with model "(unknown)", not a blank; and how fresh the
export is (the rollups it reads are refreshed by the metering job every
ROLLUP_REFRESH_SECONDS), as its description says."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from config.schedule import BEAT_SCHEDULE
from metering.api.views import ROLLUP_REFRESH_SECONDS, UNKNOWN_MODEL
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from tenants.choices import Scope
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key
from tests.metering.conftest import T0

URL = "/api/v1/usage"
RANGE = {"start": "2026-10-05", "end": "2026-10-06", "group_by": "hour"}


def _client(tenant):
    _key, secret = make_key(tenant, scopes=(Scope.USAGE_READ,))
    return client_for_key(secret)


def _csv(response) -> list[dict]:
    return list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))


def _malformed(ledger, request_id: str, tenant=None) -> dict:
    """A request the gateway refused before any replica: no model known."""
    return ledger.event(
        request_id,
        tenant=tenant,
        model="",
        replica_id=None,
        status="rejected",
        http_status=400,
        prompt_tokens=0,
        completion_tokens=0,
        sent_at=None,
        first_token_at=None,
        queue_ms=None,
        ttft_ms=None,
        generation_ms=None,
    )


def _record(ledger, *events) -> None:
    usage_record_batch(events=list(events), source=EventSource.API)
    metering_run(now=T0 + timedelta(hours=5))


def test_csv_and_json_write_period_start_alike(ledger):
    _record(
        ledger,
        ledger.event("a1"),
        ledger.event("a2", at=T0 + timedelta(hours=2)),
        ledger.event("b1", tenant=ledger.b),
    )
    client = _client(ledger.a)

    json_rows = client.get(URL, RANGE).json()["results"]
    csv_rows = _csv(client.get(URL, {**RANGE, "format": "csv"}))

    assert [r["period_start"] for r in json_rows] == [
        "2026-10-05T12:00:00Z",
        "2026-10-05T14:00:00Z",
    ]
    assert [r["period_start"] for r in csv_rows] == [r["period_start"] for r in json_rows]
    assert {r["tenant"] for r in csv_rows} == {ledger.a.slug}  # B's row stays B's


def test_a_malformed_request_is_a_row_with_model_unknown(ledger):
    _record(
        ledger,
        ledger.event("a1"),
        _malformed(ledger, "bad-a"),
        _malformed(ledger, "bad-b", ledger.b),
    )
    client = _client(ledger.a)

    json_rows = client.get(URL, RANGE).json()["results"]
    csv_rows = _csv(client.get(URL, {**RANGE, "format": "csv"}))

    assert sorted((r["model"], r["requests_rejected"]) for r in json_rows) == [
        (UNKNOWN_MODEL, 1),
        (ledger.model.name, 0),
    ]
    assert sorted((r["model"], r["requests_rejected"]) for r in csv_rows) == [
        (UNKNOWN_MODEL, "1"),
        (ledger.model.name, "0"),
    ]
    assert all(r["model"] for r in json_rows + csv_rows)
    finance = client_for_user(make_finance_user()).get(URL, RANGE).json()["results"]
    assert sorted(
        (r["tenant"], r["model"]) for r in finance if r["model"] == UNKNOWN_MODEL
    ) == sorted([(ledger.a.slug, UNKNOWN_MODEL), (ledger.b.slug, UNKNOWN_MODEL)])


def test_usage_shows_once_the_metering_job_refreshes_the_rollups(ledger):
    """Where the export's lag comes from: a request in the ledger is not in
    the export until the metering job rolls its hour up; the job runs
    every ROLLUP_REFRESH_SECONDS (beat), so a request shows within that
    (half of it on average), as the description says."""
    client = _client(ledger.a)
    usage_record_batch(events=[ledger.event("a1")], source=EventSource.API)

    assert client.get(URL, RANGE).json()["results"] == []  # in the ledger, not rolled up yet
    metering_run(now=T0 + timedelta(seconds=30))
    (row,) = client.get(URL, RANGE).json()["results"]
    assert (row["prompt_tokens"], row["completion_tokens"]) == (20, 10)

    assert BEAT_SCHEDULE["metering-run"]["schedule"] == ROLLUP_REFRESH_SECONDS == 60
    schema = client_for_user(make_finance_user()).get("/api/schema/", {"format": "json"})
    description = schema.json()["paths"]["/api/v1/usage"]["get"]["description"]
    assert f"refreshes every {ROLLUP_REFRESH_SECONDS} seconds" in description
    assert '"(unknown)"' in str(schema.json()["components"]["schemas"]["UsageRowOut"])
    assert "ISO 8601 in UTC" in description
