"""GET /api/v1/usage: read from rollups, a tenant
sees only its own rows, finance sees all, pages by cursor, CSV streamed,
bad parameters named."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest

from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from tenants.choices import Scope
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key
from tests.metering.conftest import T0

URL = "/api/v1/usage"
RANGE = {"start": "2026-10-05", "end": "2026-10-06"}


@pytest.fixture
def usage(ledger):
    """A: two requests at 12:00 and one at 14:00; B: one at 12:00 (none overlap).
    In the gateway's queue: a1 40 ms, a2 not at all, a3 not measured, b1 7.5 ms."""
    usage_record_batch(
        events=[
            ledger.event("a1", gateway_queue_ms=Decimal("40")),
            ledger.event(
                "a2", at=T0 + timedelta(seconds=30), cached_tokens=5, gateway_queue_ms=Decimal(0)
            ),
            ledger.event("a3", at=T0 + timedelta(hours=2)),
            ledger.event(
                "b1",
                tenant=ledger.b,
                at=T0 + timedelta(seconds=10),
                completion_tokens=3,
                gateway_queue_ms=Decimal("7.5"),
            ),
        ],
        source=EventSource.API,
    )
    metering_run(now=T0 + timedelta(hours=5))
    return ledger


def client_of(tenant, scopes=(Scope.USAGE_READ,)):
    _key, secret = make_key(tenant, scopes=scopes)
    return client_for_key(secret)


def read_csv(response) -> list[dict]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(body)))


def test_a_tenant_reads_only_its_own_usage(usage):
    response = client_of(usage.a).get(URL, RANGE)
    assert response.status_code == 200, response.json()
    (row,) = response.json()["results"]
    assert (row["tenant"], row["model"], row["period_start"]) == (
        usage.a.slug,
        "tiny-llama",
        "2026-10-05T00:00:00Z",
    )
    assert (row["prompt_tokens"], row["cached_tokens"], row["completion_tokens"]) == (60, 5, 30)
    assert (row["requests"], row["device_seconds"]) == (3, "2.700000000")
    other = client_of(usage.a).get(URL, {**RANGE, "tenant": usage.b.slug})
    assert other.status_code == 404


def test_finance_reads_everyone_or_one_tenant(usage):
    finance = client_for_user(make_finance_user())
    rows = finance.get(URL, {**RANGE, "group_by": "hour"}).json()["results"]
    assert [(r["period_start"][11:16], r["tenant"]) for r in rows] == [
        ("12:00", usage.a.slug),
        ("12:00", usage.b.slug),
        ("14:00", usage.a.slug),
    ]
    only_b = finance.get(URL, {**RANGE, "tenant": usage.b.slug}).json()["results"]
    assert [(r["tenant"], r["completion_tokens"]) for r in only_b] == [(usage.b.slug, 3)]


def test_pages_follow_the_cursor_without_gaps_or_repeats(usage):
    finance = client_for_user(make_finance_user())
    seen, cursor = [], None
    while True:
        params = {**RANGE, "group_by": "hour", "limit": 1} | ({"cursor": cursor} if cursor else {})
        page = finance.get(URL, params).json()
        seen += [(r["period_start"], r["tenant"]) for r in page["results"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 3


def test_csv_streams_the_tenants_rows_only(usage):
    response = client_of(usage.b).get(URL, {**RANGE, "group_by": "hour", "format": "csv"})
    assert response.status_code == 200 and response["Content-Type"] == "text/csv"
    rows = read_csv(response)
    assert [(r["tenant"], r["completion_tokens"]) for r in rows] == [(usage.b.slug, "3")]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-10-06", "end": "2026-10-05"}, "end"),
        ({"start": "2026-01-01", "end": "2026-10-05", "group_by": "hour"}, "end"),
        ({**RANGE, "group_by": "week"}, "group_by"),
        ({"end": "2026-10-05"}, "start"),
        ({**RANGE, "cursor": "garbage"}, "cursor"),
        ({**RANGE, "limit": 0}, "limit"),
        ({**RANGE, "format": "xml"}, "format"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(usage, params, field):
    response = client_of(usage.a).get(URL, params)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == field


def test_a_key_without_usage_read_is_refused(usage):
    response = client_of(usage.a, scopes=(Scope.INFERENCE,)).get(URL, RANGE)
    assert response.status_code == 403


GATEWAY_QUEUE = (
    "gateway_queue_ms_sum",
    "gateway_queue_ms_mean",
    "gateway_queue_requests",
    "gateway_queued_requests",
)


def test_usage_carries_the_gateway_queue_time_of_the_tenant_only(usage):
    (day,) = client_of(usage.a).get(URL, RANGE).json()["results"]
    # a1 waited 40 ms, a2 not at all, a3 recorded none: a mean over two.
    assert [day[k] for k in GATEWAY_QUEUE] == ["40.000", "20.000", 2, 1]
    hours = client_of(usage.a).get(URL, {**RANGE, "group_by": "hour"}).json()["results"]
    assert [[h[k] for k in GATEWAY_QUEUE] for h in hours] == [
        ["40.000", "20.000", 2, 1],
        ["0.000", None, 0, 0],  # 14:00: a3 only, not measured
    ]
    (b_day,) = client_of(usage.b).get(URL, RANGE).json()["results"]
    assert [b_day[k] for k in GATEWAY_QUEUE] == ["7.500", "7.500", 1, 1]


def test_usage_csv_has_the_gateway_queue_columns(usage):
    rows = read_csv(client_of(usage.a).get(URL, {**RANGE, "group_by": "hour", "format": "csv"}))
    assert [[r[k] for k in GATEWAY_QUEUE] for r in rows] == [
        ["40.000", "20.000", "2", "1"],
        ["0.000", "", "0", "0"],
    ]
    (b_row,) = read_csv(client_of(usage.b).get(URL, {**RANGE, "format": "csv"}))
    assert [b_row[k] for k in GATEWAY_QUEUE] == ["7.500", "7.500", "1", "1"]
