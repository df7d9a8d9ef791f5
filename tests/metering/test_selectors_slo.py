"""SLO figures from the ledger (metering.selectors.slo.slo_figures), computed
in SQL: worked by hand in tests/slo.py."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from metering.selectors.slo import slo_figures
from tests.metering.conftest import T0
from tests.slo import COUNTED, FAILED, ITL_P95, TTFT_P95, slo_day

DAY = T0.replace(hour=0)


def test_a_tenants_day_from_the_ledger(ledger):
    slo_day(ledger, ledger.a, T0)
    # Bravo: one slow request and a 503; never in Alpha's figures.
    usage_record_batch(
        events=[
            ledger.event("b-1", tenant=ledger.b, first_token_at=T0 + timedelta(seconds=2),
                         ended_at=T0 + timedelta(seconds=3)),
            ledger.event("b-2", tenant=ledger.b, status="error", http_status=503,
                         first_token_at=None),
        ],
        source=EventSource.API,
    )  # fmt: skip
    (a,) = slo_figures(
        start=DAY, end=DAY + timedelta(days=1), tenant_ids=[ledger.a.pk], by_day=True
    )
    assert a == {
        "key": ledger.a.pk,
        "day": date(2026, 10, 5),
        "requests": COUNTED,
        "failed": FAILED,
        "timed": 20,
        "ttft_p95_ms": Decimal(TTFT_P95),
        "itl_p95_ms": Decimal(ITL_P95),
    }
    rows = slo_figures(start=DAY, end=DAY + timedelta(days=1), tenant_ids=None, by_day=False)
    b = next(row for row in rows if row["key"] == ledger.b.pk)
    # One completed request: its TTFT is the p95; 1 of 2 failed.
    assert (b["requests"], b["failed"], b["ttft_p95_ms"]) == (2, 1, Decimal("2000.000"))
    assert b["day"] is None


def test_days_are_utc_days_and_the_range_is_half_open(ledger):
    slo_day(ledger, ledger.a, T0)
    slo_day(ledger, ledger.a, T0 + timedelta(days=1), prefix="next")
    rows = slo_figures(
        start=DAY, end=DAY + timedelta(days=2), tenant_ids=[ledger.a.pk], by_day=True
    )
    assert [(r["day"], r["requests"]) for r in rows] == [
        (date(2026, 10, 5), COUNTED),
        (date(2026, 10, 6), COUNTED),
    ]
    (first,) = slo_figures(
        start=DAY, end=DAY + timedelta(days=1), tenant_ids=[ledger.a.pk], by_day=False
    )
    assert first["requests"] == COUNTED


def test_platform_queue_refusals_count_and_a_tenants_own_limits_do_not(ledger):
    """The 429s as the gateway records them (gateway/recording.py): the
    code first. The platform's queue (queue_timeout, queue_full) fails
    availability; a tenant's own limits, even after waiting, are left out."""
    refused = {"status": "rejected", "http_status": 429, "first_token_at": None}
    events = [
        ledger.event("full", **refused, error="queue_full: too many of the tenant's requests "
                     "waiting at the gateway (max_queued_requests 100)"),
        ledger.event("slot", **refused, error="queue_timeout: no model server slot within the "
                     "tenant's queue timeout (2s; waited 2.000s)"),
        ledger.event("rpm", **refused, error="requests_per_minute: requests per minute limit "
                     "reached (limit 60)"),
        ledger.event("waited", **refused, error="max_concurrent_requests: too many concurrent "
                     "requests (limit 4); waited 2.000s (the tenant's queue timeout)"),
        ledger.event("message-only", **refused, error="no model server slot within the "
                     "tenant's queue timeout (2s; waited 2.000s)"),
        ledger.event("budget", status="rejected", http_status=402, first_token_at=None,
                     error="monthly budget reached"),
        ledger.event("fine"),
    ]  # fmt: skip
    usage_record_batch(events=events, source=EventSource.API)
    (row,) = slo_figures(
        start=DAY, end=DAY + timedelta(days=1), tenant_ids=[ledger.a.pk], by_day=False
    )
    assert (row["requests"], row["failed"]) == (3, 2)


def test_by_tier(ledger):
    slo_day(ledger, ledger.a, T0)
    slo_day(ledger, ledger.b, T0, prefix="b")
    (shared,) = slo_figures(
        start=DAY, end=DAY + timedelta(days=1), tenant_ids=None, by_day=False, group="tier"
    )
    assert (shared["key"], shared["requests"], shared["failed"]) == ("shared", 48, 6)
    assert shared["ttft_p95_ms"] == Decimal(TTFT_P95)  # the same values twice over
