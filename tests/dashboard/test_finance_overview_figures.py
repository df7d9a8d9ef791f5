"""The finance overview's month-to-date figures as finance reads them: a
period that is not whole days shows its times, a margin % on revenue below
the floor reads "n/m", fees and idle capacity that name no model are two
rows of their own, and the run-rate counts the current hour by its elapsed
part. Two tenants: Alpha billed in USD, Yen KK in JPY (no minor units)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing.choices import ReportKind, RunStatus
from billing.models import FxRate
from billing.reports.margin_reports import margin_report_build, margin_report_request
from billing.reports.margins import FEES, IDLE
from core.calendar import period_text
from tests.conftest import PINNED_NOW
from tests.factories import make_finance_user, make_tenant

D = Decimal
HOUR = timedelta(hours=1)
NOV = datetime(2026, 11, 1, tzinfo=UTC)
NEXT_HOUR = datetime(2026, 11, 28, 11, tzinfo=UTC)  # the demo's report: up to the next hour
JPY_USD = D("0.0065")


@pytest.fixture
def month_so_far(world, pinned_clock):
    """Built at 10:30 on Nov 28, up to 11:00, as the demo builds it.
    Alpha (USD, shared pool, platform idle): 2,500 output tokens at $4/M =
    0.01 USD in the 09:00 hour, on a $1/h GPU. Yen KK (JPY, reserved tier)
    reserves the reserved pool's one $1/h GPU from Nov 28 00:00 at 100 JPY
    a GPU-hour: 11 hours to 11:00 = 1,100 JPY = 7.15 USD at 0.0065, a fee
    naming no model; its GPU idles. Allocation books 08:00 and 09:00 (none
    from the current hour on): 4.00 USD of cost."""
    pinned_clock.move_to(PINNED_NOW, tick=False)
    world.price()
    world.price(currency="JPY", reservation=D(100))
    yen = make_tenant(name="Yen KK", billing_currency="JPY", tier="reserved")
    for day in range(1, 29):
        FxRate.objects.create(
            base="JPY", quote="USD", date=date(2026, 11, day), rate=JPY_USD, source="test"
        )
    shared = world.pool("shared", policy="platform")
    reserved = world.pool("reserved", kind="reserved", owner=yen)
    r1 = world.replica("r1", shared, [world.gpu("g1")])
    world.replica("r2", reserved, [world.gpu("g2")])
    world.reserve(yen, reserved, 1, start=datetime(2026, 11, 28, tzinfo=UTC))
    world.use(world.a, r1, 1, hour=datetime(2026, 11, 28, 9, tzinfo=UTC), completion=2_500)
    world.allocate(start=datetime(2026, 11, 28, 8, tzinfo=UTC), end=NEXT_HOUR)
    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.MONTH_TO_DATE, start=NOV, end=NEXT_HOUR).pk
    )
    assert report.status == RunStatus.DONE, report.error
    return report, yen


def _page(client) -> str:
    client.force_login(make_finance_user())
    return client.get("/finance/").content.decode()


def _section(html: str, testid: str, end: str = "</table>") -> str:
    return html.split(f'data-testid="{testid}"')[1].split(end)[0]


def test_a_period_that_is_not_whole_days_shows_its_times(month_so_far, client):
    period = _section(_page(client), "report-period", "</p>")

    assert "Month to date: 2026-11-01 00:00 to 2026-11-28 11:00 UTC (end excluded)" in period
    assert "same days last month: 2026-10-01 00:00 to 2026-10-28 11:00." in period


@pytest.mark.parametrize(
    ("start", "end", "text"),
    [
        ((2026, 11, 1), (2026, 11, 24), "2026-11-01 to 2026-11-24"),
        ((2026, 12, 1), (2026, 12, 1, 20), "2026-12-01 00:00 to 20:00"),
        ((2026, 11, 30, 22), (2026, 12, 1, 20), "2026-11-30 22:00 to 2026-12-01 20:00"),
    ],
)
def test_period_text(start, end, text):
    assert period_text(datetime(*start, tzinfo=UTC), datetime(*end, tzinfo=UTC)) == text


def test_margin_percent_below_the_revenue_floor_reads_not_meaningful(month_so_far, client):
    """The shared pool kind: 0.01 USD of revenue against 2.00 USD of cost
    (-19,900%): below 1% of cost, "n/m". The reserved pool kind: 7.15 USD
    of fees against 2.00 USD: 72.0%."""
    report, _yen = month_so_far
    tiers = {row["tier"]: row for row in report.tables["tier"]}
    assert (tiers["shared"]["revenue"], tiers["shared"]["cost"]) == ("0.01", "2.00")
    assert tiers["shared"]["margin_pct"] is None and tiers["shared"]["margin_pct_nm"] is True
    assert round(tiers["reserved"]["margin_pct"], 1) == 72.0
    assert tiers["reserved"]["margin_pct_nm"] is False

    html = _page(client)

    shared = _section(html, "by-tier").split("<td>shared</td>")[1].split("</tr>")[0]
    assert "<td>n/m</td>" in shared and "19" not in shared.split("<td>n/m</td>")[0][-40:]
    reserved = _section(html, "by-tier").split("<td>reserved</td>")[1].split("</tr>")[0]
    assert "<td>72.0</td>" in reserved
    assert "below 1% of cost" in _section(html, "margin-pct-note", "</p>")


def test_fees_and_idle_naming_no_model_are_rows_of_their_own(month_so_far, client):
    """By model: the tokens' model (tiny, 0.01 USD), Yen KK's reservation
    fee (7.15 USD, as billed 1,100 JPY) and the idle capacity no model's
    usage carried: Yen KK's idle reserved GPU (2.00) and the shared pool's
    unabsorbed idle (2.00 less Alpha's second), apart."""
    report, _yen = month_so_far
    models = {row["model"]: row for row in report.tables["model"]}

    assert set(models) == {"tiny", FEES, IDLE}
    assert (models[FEES]["revenue"], models[FEES]["cost"]) == ("7.15", "0.00")
    assert models[FEES]["revenue_by_currency"] == {"JPY": "1100.00"}
    assert (models[IDLE]["revenue"], models[IDLE]["cost"]) == ("0.00", "4.00")
    assert models[IDLE]["margin_pct_nm"] is True
    assert models["tiny"]["revenue"] == "0.01"
    total = sum(D(row["revenue"]) for row in models.values())
    assert total == D(report.totals["revenue"]).quantize(D("0.01"))

    table = _section(_page(client), "by-model")

    assert "(idle, fees, unabsorbed)" not in table
    fees = table.split(f"<td>{FEES}</td>")[1].split("</tr>")[0]
    assert fees.startswith("<td>7.15</td><td>0.00</td><td>7.15</td><td>100.0</td>")
    idle = table.split(f"<td>{IDLE}</td>")[1].split("</tr>")[0]
    assert idle.startswith("<td>0.00</td><td>4.00</td><td>-4.00</td><td>n/m</td>")
    assert 'data-testid="model-link">tiny</a>' in table
    assert table.count('data-testid="model-link"') == 1  # the labels are no model's page


def test_the_run_rate_counts_the_current_hour_by_its_elapsed_part(month_so_far, client):
    """Built at 10:30: revenue so far (7.16 USD) is over 27 days 10.5 hours
    (658.5 h) of November's 720, not 659: 7.16 x 720 / 658.5 = 7.8287...
    Cost is booked to 10:00 (658 h): 4.00 x 720 / 658 = 4.3769...
    Margin 7.828701 - 4.376900 = 3.451800 (nano-exact)."""
    report, _yen = month_so_far
    forecast = {k: D(v) for k, v in report.forecast["totals"].items()}

    assert forecast["revenue"] == (D("7.16") * 720 / D("658.5")).quantize(D("1e-9"))
    assert forecast["cost"] == (D(4) * 720 / D(658)).quantize(D("1e-9"))
    assert forecast["margin"] == forecast["revenue"] - forecast["cost"]
    assert D(report.forecast["elapsed_days"]) == D("658.5") / 24
    assert D(report.forecast["cost_elapsed_days"]) == D(658) / 24

    text = _section(_page(client), "forecast", "</p>")

    assert "revenue <strong>7.83 USD</strong>" in text
    assert "cost <strong>4.38 USD</strong>" in text
    assert "the current hour by its elapsed part" in text
