"""Month to date compared with the same days of last month (clamped at that
month's end), not with the whole of it, and a run-rate forecast of the
whole month beside it: the period arithmetic and the finance overview."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from billing.choices import ReportKind, RunStatus
from billing.reports.margin_reports import (
    margin_report_build,
    margin_report_request,
    previous_period,
    report_period,
    run_rate_forecast,
)
from tests.factories import make_finance_user, make_tenant


def utc(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


@pytest.mark.parametrize(
    ("start", "end", "previous"),
    [
        # Nov 1-23 against Oct 1-23 (ends are exclusive).
        (utc(2026, 11, 1), utc(2026, 11, 24), (utc(2026, 10, 1), utc(2026, 10, 24))),
        # Mar 1-30 and Mar 1-28 against all of February, clamped at its end.
        (utc(2026, 3, 1), utc(2026, 3, 31), (utc(2026, 2, 1), utc(2026, 3, 1))),
        (utc(2026, 3, 1), utc(2026, 3, 29), (utc(2026, 2, 1), utc(2026, 3, 1))),
        (utc(2026, 3, 1), utc(2026, 3, 28), (utc(2026, 2, 1), utc(2026, 2, 28))),
        # A leap February has its 29th.
        (utc(2028, 3, 1), utc(2028, 3, 31), (utc(2028, 2, 1), utc(2028, 3, 1))),
        (utc(2028, 3, 1), utc(2028, 3, 30), (utc(2028, 2, 1), utc(2028, 3, 1))),
        # May 1-30 against April 1-30: April has 30 days, all of it.
        (utc(2026, 5, 1), utc(2026, 5, 31), (utc(2026, 4, 1), utc(2026, 5, 1))),
        # Across the year; and the report made on the 1st (all of last month).
        (utc(2027, 1, 1), utc(2027, 1, 16), (utc(2026, 12, 1), utc(2026, 12, 16))),
        (utc(2026, 10, 1), utc(2026, 11, 1), (utc(2026, 9, 1), utc(2026, 10, 1))),
    ],
)
def test_month_to_date_is_compared_with_the_same_days_of_last_month(start, end, previous):
    assert previous_period(kind=ReportKind.MONTH_TO_DATE, start=start, end=end) == previous


def test_other_reports_keep_their_comparison():
    oct_, nov = utc(2026, 10, 1), utc(2026, 11, 1)
    assert previous_period(kind=ReportKind.CLOSE, start=oct_, end=nov) == (utc(2026, 9, 1), oct_)
    week = (utc(2026, 11, 9), utc(2026, 11, 16))
    assert previous_period(kind=ReportKind.FLASH, start=week[0], end=week[1]) == (
        utc(2026, 11, 2),
        week[0],
    )
    # The nightly month-to-date report on the 24th, and on the 1st.
    assert report_period(kind=ReportKind.MONTH_TO_DATE, now=utc(2026, 11, 24, 3, 30)) == (
        nov,
        utc(2026, 11, 24),
    )
    assert report_period(kind=ReportKind.MONTH_TO_DATE, now=utc(2026, 11, 1, 3, 30)) == (
        oct_,
        nov,
    )


def test_the_run_rate_forecast_by_hand():
    """23 of November's 30 days: x 30/23. Revenue 4.6 -> 6.000000000;
    cost 1 -> 1.304347826086... -> 1,304,347,826 nano (half-even);
    margin = 6,000,000,000 - 1,304,347,826 = 4,695,652,174 exactly."""
    so_far = {"revenue": 4_600_000_000, "cost": 1_000_000_000}
    forecast = run_rate_forecast(
        so_far, start=utc(2026, 11, 1), end=utc(2026, 11, 24), month_end=utc(2026, 12, 1)
    )
    assert forecast == {"revenue": 6_000_000_000, "cost": 1_304_347_826, "margin": 4_695_652_174}
    whole = run_rate_forecast(
        so_far, start=utc(2026, 10, 1), end=utc(2026, 11, 1), month_end=utc(2026, 11, 1)
    )
    assert whole == {"revenue": 4_600_000_000, "cost": 1_000_000_000, "margin": 3_600_000_000}


def test_the_overview_shows_the_same_days_of_last_month_and_the_forecast(world, client):
    """Alpha: 1 M output tokens ($4) on Oct 3, 2 M ($8) on Oct 28, and
    1.15 M ($4.60) on Nov 3. Month to date Nov 1-23 is compared with
    Oct 1-23 only ($4, not $12); the forecast is 4.60 x 30 / 23 = 6.00.
    Bravo, billing in EUR, used nothing: no rate is needed for it."""
    world.price()
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    world.tokens(world.a, hour=utc(2026, 10, 3, 10), completion=1_000_000)
    world.tokens(world.a, hour=utc(2026, 10, 28, 10), completion=2_000_000)
    world.tokens(world.a, hour=utc(2026, 11, 3, 10), completion=1_150_000)
    start, end = utc(2026, 11, 1), utc(2026, 11, 24)

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.MONTH_TO_DATE, start=start, end=end).pk
    )

    assert report.status == RunStatus.DONE, report.error
    assert (report.previous_start, report.previous_end) == (utc(2026, 10, 1), utc(2026, 10, 24))
    tier = next(row for row in report.tables["tier"] if row["tier"] == "shared")
    assert (tier["revenue"], tier["prev_revenue"]) == ("4.60", "4.00")
    totals = {k: Decimal(v) for k, v in report.forecast["totals"].items()}
    assert totals == {"revenue": Decimal(6), "cost": 0, "margin": Decimal(6)}
    assert report.forecast["tiers"]["shared"]["revenue"] == "6.000000000"
    assert report.fx_rates == []  # nothing billed in EUR: no rate needed
    assert euro.slug not in {row["tenant"] for row in report.tables["tenant"]}

    client.force_login(make_finance_user())
    html = client.get("/finance/").content.decode()

    period = html.split('data-testid="report-period"')[1].split("</p>")[0]
    assert "2026-11-01 to 2026-11-24" in period
    assert "same days last month: 2026-10-01 to 2026-10-24" in period
    assert "All amounts in USD" in period
    forecast = html.split('data-testid="forecast"')[1].split("</p>")[0]
    assert "Run-rate forecast for November 2026" in forecast
    assert "revenue <strong>6.00 USD</strong>" in forecast
    assert "elapsed fraction of the month (23 of 30 days)" in forecast
    tiers = html.split('data-testid="by-tier"')[1].split("</table>")[0]
    assert "Revenue, same days last month, USD" in tiers and "Forecast revenue, USD" in tiers
    row = tiers.split("<td>shared</td>")[1].split("</tr>")[0]
    assert "<td>4.60</td>" in row and "<td>4.00</td>" in row and "<td>6.00</td>" in row
    chart = client.get("/finance/").context["chart"]
    assert chart["datasets"][3]["label"] == "Margin, same days last month"


def test_a_report_request_months_apart_is_stored_with_both_ends(db):
    report = margin_report_request(
        kind=ReportKind.MONTH_TO_DATE, start=utc(2026, 3, 1), end=utc(2026, 3, 31)
    )
    assert (report.previous_start, report.previous_end) == (utc(2026, 2, 1), utc(2026, 3, 1))
    assert report.previous_period_end == utc(2026, 3, 1)
    report.previous_end = None  # a report stored before previous_end existed
    assert report.previous_period_end == report.period_start
    assert timedelta(0) < report.period_end - report.period_start
