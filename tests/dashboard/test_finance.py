"""The finance overview's gateway queue figure: per tier over the shown
report's period, the share of requests that waited in the gateway's queue
and the mean wait, counting only requests that recorded a queue time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from billing.choices import ReportKind
from billing.reports.margin_reports import margin_report_build, margin_report_request
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from tenants.choices import Tier
from tenants.models import Tenant
from tests.factories import make_finance_user
from tests.ledger import T0

OCT, NOV = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 11, 1, tzinfo=UTC)


def _queue_usage(ledger, *events) -> None:
    usage_record_batch(events=list(events), source=EventSource.API)
    metering_run(now=T0 + timedelta(days=41))


def _queue_figures(page) -> dict:
    return {
        row["tier"]: (
            row["requests"],
            row["timed"],
            row["queued_pct"],
            row["mean_ms"],
            row["mean_queued_ms"],
        )
        for row in page.context["gateway_queue"]
    }


def test_the_overview_shows_gateway_queue_time_by_tier(client, ledger):
    Tenant.objects.filter(pk=ledger.b.pk).update(tier=Tier.RESERVED)
    second = timedelta(seconds=1)
    _queue_usage(
        ledger,
        ledger.event("a1", gateway_queue_ms=Decimal("30")),
        ledger.event("a2", at=T0 + 2 * second, gateway_queue_ms=Decimal("0")),
        ledger.event("a3", at=T0 + 4 * second),  # recorded no queue time
        ledger.event("b1", tenant=ledger.b, gateway_queue_ms=Decimal("10")),
        ledger.event("b2", tenant=ledger.b, at=T0 + 2 * second, gateway_queue_ms=30),
        # November: outside the report's period.
        ledger.event("late", at=T0 + timedelta(days=40), gateway_queue_ms=Decimal("999")),
    )
    report = margin_report_request(kind=ReportKind.CLOSE, start=OCT, end=NOV)
    margin_report_build(report_id=report.pk)
    client.force_login(make_finance_user())

    page = client.get("/finance/")

    assert page.status_code == 200
    # Kept with the report when it was built (its stored tables: decimals
    # as fixed-point text), not aggregated again from a month of rollups.
    assert _queue_figures(page) == {
        "shared": (3, 2, "50.0", "15.000", "30.000"),
        "reserved": (2, 2, "100.0", "20.000", "20.000"),
    }
    html = page.content.decode()
    assert 'data-testid="gateway-queue"' in html
    assert "<td>shared</td><td>3</td><td>2</td><td>50.0</td><td>15.000</td>" in html

    # Usage that reaches the period after the build shows with the rest of
    # the report once it is built again, not before.
    _queue_usage(ledger, ledger.event("a4", at=T0 + 6 * second, gateway_queue_ms=Decimal("90")))
    assert _queue_figures(client.get("/finance/"))["shared"] == (3, 2, "50.0", "15.000", "30.000")
    margin_report_build(report_id=report.pk)
    assert _queue_figures(client.get("/finance/"))["shared"] == (4, 3, "66.7", "40.000", "60.000")


def test_a_report_built_without_the_queue_table_shows_it_from_the_rollups(client, ledger):
    _queue_usage(ledger, ledger.event("a1", gateway_queue_ms=Decimal("30")))
    report = margin_report_request(kind=ReportKind.CLOSE, start=OCT, end=NOV)
    margin_report_build(report_id=report.pk)
    report.refresh_from_db()
    report.tables = {k: v for k, v in report.tables.items() if k != "gateway_queue"}
    report.save(update_fields=["tables"])
    client.force_login(make_finance_user())

    page = client.get("/finance/")

    assert _queue_figures(page) == {
        "shared": (1, 1, Decimal("100.0"), Decimal("30.000"), Decimal("30.000"))
    }


def test_the_overview_charts_the_queues_mean_depth_by_tier_hour_by_hour(client, ledger):
    """Little's law: the time an hour's requests waited over the hour's
    length is how many waited on average; tiers apart, other hours 0."""
    Tenant.objects.filter(pk=ledger.b.pk).update(tier=Tier.RESERVED)
    hour = timezone.now().replace(minute=0, second=0, microsecond=0) - timedelta(hours=3)
    minute = timedelta(minutes=1)
    usage_record_batch(
        events=[
            # shared, `hour`: 45 and 9 minutes waited in all -> 0.9 waiting
            ledger.event("a1", at=hour + minute, gateway_queue_ms=Decimal(45 * 60_000)),
            ledger.event("a2", at=hour + 2 * minute, gateway_queue_ms=Decimal(9 * 60_000)),
            # reserved, the hour after: 6 minutes -> 0.1
            ledger.event("b1", tenant=ledger.b, at=hour + 61 * minute, gateway_queue_ms=360_000),
            # three days ago: outside the chart
            ledger.event("old", at=hour - timedelta(days=3), gateway_queue_ms=Decimal(10**6)),
        ],
        source=EventSource.API,
    )
    metering_run(now=timezone.now() + timedelta(hours=1))
    client.force_login(make_finance_user())

    page = client.get("/finance/")

    chart = page.context["queue_depth_chart"]
    assert len(chart["labels"]) == 48
    at = chart["labels"].index(f"{hour:%m-%d %H}h")
    series = {d["label"]: d["data"] for d in chart["datasets"]}
    assert set(series) == {"shared", "reserved"}
    assert series["shared"][at : at + 2] == [0.9, 0.0]
    assert series["reserved"][at : at + 2] == [0.0, 0.1]
    assert sum(series["shared"]) == 0.9 and sum(series["reserved"]) == 0.1
    assert 'data-testid="queue-depth-chart"' in page.content.decode()


def test_the_overview_says_when_the_queue_chart_has_no_usage(client, db):
    client.force_login(make_finance_user())
    page = client.get("/finance/")
    assert page.context["queue_depth_chart"]["datasets"] == []
    assert 'data-testid="queue-depth-empty"' in page.content.decode()
