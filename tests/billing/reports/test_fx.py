"""One reporting currency: revenue billed in euros and in dollars converted
at dated FX rates (worked by hand), a missing rate failing the report with
the pair and the day, rates entered through the API and imported from CSV
files (all or nothing), and the finance pages saying the currency."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from billing.choices import ReportKind, RunStatus
from billing.errors import FxRateMissingError
from billing.fx import FxTable
from billing.models import FxRate
from billing.reports.margin_reports import margin_report_build, margin_report_request
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key, make_tenant

D = Decimal
HOUR = timedelta(hours=1)
# Two hours across midnight: the period touches two days, one hour each.
T0 = datetime(2026, 10, 5, 23, tzinfo=UTC)
T1 = T0 + 2 * HOUR


def _rate(base, quote, day, rate):
    return FxRate.objects.create(base=base, quote=quote, date=day, rate=D(rate), source="test")


@pytest.fixture
def two_currencies(world):
    """Alpha bills in USD, Euro Co in EUR; both on one $1/h GPU whose idle
    time stays platform cost; 4 per million output tokens, Alpha from the
    USD book and Euro Co from the EUR one."""
    world.price()
    world.price(currency="EUR")  # Euro Co's book: the same figures in euros
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, hour=T0, seconds=1800, completion=1_000_000)
    world.use(euro, replica, hour=T0 + HOUR, seconds=900, completion=333_333)
    world.allocate(start=T0, end=T1)
    return euro


def test_revenue_in_two_currencies_is_converted_by_hand(two_currencies, world, client):
    """By hand, in USD:
    Alpha: 1,000,000 tokens x $4/M                 = 4.000000000 USD
    Euro Co: 333,333 tokens x 4/M                  = 1.333332000 EUR
    EUR/USD: 1.0800 on Oct 5, 1.0903 on Oct 6, one hour of the period each:
      average (1.0800 x 1 h + 1.0903 x 1 h) / 2 h  = 1.08515
    Euro Co in USD: 1,333,332,000 nano x 1.08515   = 1,446,865,219.8 nano
      rounded once, half-even                      = 1.446865220 USD
    Revenue 4.000000000 + 1.446865220              = 5.446865220 USD
    Cost: 2 GPU-hours x $1 = 2 USD (Alpha 0.50, Euro Co 0.25, idle 1.25)
    Margin 5.446865220 - 2                         = 3.446865220 USD"""
    euro = two_currencies
    _rate("EUR", "USD", date(2026, 10, 5), "1.0800")
    _rate("EUR", "USD", date(2026, 10, 6), "1.0903")
    _rate("EUR", "JPY", date(2026, 10, 6), "160")  # not needed: not listed

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=T0, end=T1).pk
    )

    assert report.status == RunStatus.DONE, report.error
    assert report.currency == "USD"
    assert report.totals == {
        "revenue": "5.446865220",
        "cost": "2.000000000",
        "margin": "3.446865220",
        "currency": "USD",
        "revenue_by_currency": {"EUR": "1.333332000", "USD": "4.000000000"},
    }
    assert [(r["pair"], r["rate"], r["days"]) for r in report.fx_rates] == [
        ("EUR/USD", "1.085150000000", 2)
    ]
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    euro_row = next(r for r in rows if r["level"] == "tenant" and r["tenant"] == euro.slug)
    assert euro_row["currency"] == "USD"
    assert (euro_row["revenue"], euro_row["revenue_in_EUR"]) == ("1.446865220", "1.333332000")
    assert D(euro_row["revenue_in_USD"]) == 0
    assert (euro_row["cost"], euro_row["margin"]) == ("0.250000000", "1.196865220")
    tiers = [r for r in rows if r["level"] == "tier"]
    assert [t["revenue"] for t in tiers] == ["5.446865220"]
    # Exact after conversion: margin = revenue - cost on every row.
    for row in rows:
        assert D(row["margin"]) == D(row["revenue"]) - D(row["cost"])
    assert "EUR→USD" in report.html and "1.085150000000" in report.html
    assert "1.33 EUR" in report.html  # as billed, beside the converted figure

    client.force_login(make_finance_user())
    page = client.get("/finance/").content.decode()
    totals = page.split('data-testid="totals"')[1].split("</p>")[0]
    assert "5.45 USD" in totals and "2.00 USD" in totals and "3.45 USD" in totals
    note = page.split('data-testid="fx-note"')[1].split("</p>")[0]
    assert "1.33 EUR" in note and "4.00 USD" in note
    assert "EUR→USD at 1.085150000000" in note and "average of the daily FX rates" in note
    assert "Revenue, USD" in page and "Cost / M tokens, USD" in page
    drill = client.get(f"/finance/tenants/{euro.slug}/").content.decode()
    margin = drill.split('data-testid="tenant-margin"')[1].split("</section>")[0]
    assert "1.45 USD" in margin and "1.33 EUR" in margin and "0.25 USD" in margin
    model = client.get(f"/finance/models/{world.model.name}/").content.decode()
    assert "5.45 USD" in model.split('data-testid="model-margin"')[1].split("</section>")[0]


def test_a_missing_rate_fails_the_report_naming_the_pair_and_the_day(two_currencies, world, client):
    """Oct 6 has a rate, Oct 5 none (nor the 7 days before): no 1:1."""
    _rate("EUR", "USD", date(2026, 10, 6), "1.0903")
    finance = client_for_user(make_finance_user())

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.MONTH_TO_DATE, start=T0, end=T1).pk
    )

    assert report.status == RunStatus.FAILED
    assert report.error.startswith("no EUR/USD exchange rate for 2026-10-05")
    assert report.csv == "" and report.totals == {}
    api = finance.get(f"/api/v1/margin-reports/{report.pk}").json()
    assert api["status"] == "failed" and "EUR/USD" in api["error"]
    download = finance.get(f"/api/v1/margin-reports/{report.pk}/csv")
    assert download.status_code == 409
    assert "no EUR/USD exchange rate for 2026-10-05" in download.json()["error"]["message"]
    client.force_login(make_finance_user())
    page = client.get("/finance/").content.decode()
    failed = page.split('data-testid="report-failed"')[1].split("</section>")[0]
    assert "no EUR/USD exchange rate for 2026-10-05" in failed

    _rate("EUR", "USD", date(2026, 10, 5), "1.0800")  # entered: the re-run works
    again = margin_report_build(report_id=report.pk)
    assert again.status == RunStatus.DONE and again.totals["revenue"] == "5.446865220"


def test_reporting_in_euros_inverts_the_stored_rate(two_currencies, world, settings):
    """Reporting in EUR: Alpha's 4 USD at USD/EUR = 1 / 1.0850 on both days
    = 0.921658986175 (12 places); 4,000,000,000 nano x 0.921658986175
    = 3,686,635,944.7 -> 3,686,635,945 nano; plus Euro Co's 1.333332 EUR."""
    settings.REPORTING_CURRENCY = "EUR"
    for day in (date(2026, 10, 5), date(2026, 10, 6)):
        _rate("EUR", "USD", day, "1.0850")

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=T0, end=T1).pk
    )

    # Cost was booked in USD (the reporting currency then): refused rather
    # than mixed, until the allocation is run again.
    assert report.status == RunStatus.FAILED
    assert "booked in USD but the reporting currency is EUR" in report.error
    world.allocate(start=T0, end=T1)  # the $1/h GPU now costs 1 / 1.0850 EUR an hour
    report = margin_report_build(report_id=report.pk)
    assert report.status == RunStatus.DONE, report.error
    assert report.fx_rates[0]["pair"] == "USD/EUR"
    assert report.fx_rates[0]["rate"] == "0.921658986175"
    assert report.fx_rates[0]["derived"] == "inverse"
    assert report.totals["revenue"] == "5.019967945"  # 3.686635945 + 1.333332 EUR
    assert report.totals["cost"] == "1.843317972"  # 2 x 0.921658986


def test_daily_rates_direct_inverse_cross_and_the_days_before():
    table = FxTable(
        [
            ("EUR", "USD", date(2026, 10, 2), D("1.08")),
            ("EUR", "GBP", date(2026, 10, 2), D("0.80")),
            ("USD", "JPY", date(2026, 10, 2), D("150")),
        ]
    )
    friday, sunday = date(2026, 10, 2), date(2026, 10, 4)

    assert table.day_rate(base="EUR", quote="USD", day=friday) == (D("1.08"), "direct")
    assert table.day_rate(base="EUR", quote="USD", day=sunday) == (D("1.08"), "direct")
    rate, how = table.day_rate(base="USD", quote="EUR", day=friday)
    assert how == "inverse" and rate == 1 / D("1.08")
    rate, how = table.day_rate(base="GBP", quote="USD", day=friday)  # 1.08 / 0.80
    assert how == "cross via EUR" and rate == (1 / D("0.80")) * D("1.08") and rate == D("1.35")
    rate, how = table.day_rate(base="EUR", quote="JPY", day=friday)  # 1.08 x 150
    assert how == "cross via USD" and rate == D("162.00")
    with pytest.raises(FxRateMissingError, match="no EUR/USD exchange rate for 2026-10-10"):
        table.day_rate(base="EUR", quote="USD", day=date(2026, 10, 10))  # 8 days on
    with pytest.raises(FxRateMissingError, match="no CHF/USD exchange rate for 2026-10-02"):
        table.day_rate(base="CHF", quote="USD", day=friday)


# --- entering rates: the API -----------------------------------------------


def test_the_fx_api_is_for_finance_and_names_the_bad_field(world):
    finance = client_for_user(make_finance_user())
    one = {"base": "eur", "quote": "USD", "date": "2026-10-05", "rate": "1.0800"}

    created = finance.post("/api/v1/fx-rates", one, format="json")

    assert created.status_code == 201, created.json()
    assert (created.json()["base"], created.json()["rate"]) == ("EUR", "1.080000000000")
    for change, field in (
        ({"base": "EURO"}, "base"),
        ({"quote": "EUR"}, "quote"),
        ({"rate": "-1"}, "rate"),
        ({"rate": "0"}, "rate"),
        ({"rate": "1.0000000000001"}, "rate"),
        ({"date": "2026-13-01"}, "date"),
        ({}, "date"),  # already stored
    ):
        bad = finance.post("/api/v1/fx-rates", one | change, format="json")
        assert bad.status_code == 400 and bad.json()["error"]["field"] == field, (
            change,
            bad.json(),
        )
    assert FxRate.objects.count() == 1

    listed = finance.get("/api/v1/fx-rates?base=EUR&start=2026-10-01&end=2026-11-01").json()
    assert [(r["base"], r["quote"], r["date"]) for r in listed] == [("EUR", "USD", "2026-10-05")]
    assert finance.get("/api/v1/fx-rates?base=E").status_code == 400
    _, secret = make_key(world.a)
    assert client_for_key(secret).get("/api/v1/fx-rates").status_code == 403
    assert client_for_key(secret).post("/api/v1/fx-rates", one, format="json").status_code == 403


def test_bulk_rates_are_all_or_nothing(db):
    finance = client_for_user(make_finance_user())
    FxRate.objects.create(base="EUR", quote="USD", date=date(2026, 10, 5), rate=D("1.08"))
    rows = [
        {"base": "EUR", "quote": "USD", "date": "2026-10-06", "rate": "1.09"},
        {"base": "EUR", "quote": "GBP", "date": "2026-10-06", "rate": "abc"},
    ]

    bad = finance.post("/api/v1/fx-rates/bulk", {"rates": rows}, format="json")

    assert bad.status_code == 400 and bad.json()["error"]["field"] == "rates.1.rate"
    assert FxRate.objects.count() == 1
    rows[1]["rate"] = "0.85"
    changed = [*rows, {"base": "EUR", "quote": "USD", "date": "2026-10-05", "rate": "1.07"}]
    refused = finance.post("/api/v1/fx-rates/bulk", {"rates": changed}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["field"] == "rates.2.rate"
    assert "stored as 1.08" in refused.json()["error"]["message"]
    assert FxRate.objects.count() == 1
    done = finance.post("/api/v1/fx-rates/bulk", {"rates": changed, "replace": True}, format="json")
    assert done.status_code == 200 and done.json() == {"created": 2, "updated": 1, "unchanged": 0}
    assert FxRate.objects.get(quote="USD", date=date(2026, 10, 5)).rate == D("1.07")
    again = finance.post("/api/v1/fx-rates/bulk", {"rates": rows}, format="json")
    assert again.json() == {"created": 0, "updated": 0, "unchanged": 2}


# --- importing rates: the command ------------------------------------------

ECB = """Date,USD,JPY,BGN,CYP,GBP,
2026-10-06,1.0903,161.52,1.9558,N/A,0.8571,
2026-10-05,1.0800,160.10,1.9558,N/A,0.8560,
"""


def test_the_ecb_file_is_imported_per_euro(tmp_path, db):
    path = tmp_path / "eurofxref-hist.csv"
    path.write_text(ECB)
    out = io.StringIO()

    call_command("fx_rates_import", str(path), stdout=out, stderr=io.StringIO())

    assert "8 rates read: 8 created" in out.getvalue()
    usd = FxRate.objects.get(base="EUR", quote="USD", date=date(2026, 10, 6))
    assert usd.rate == D("1.0903") and "ECB" in usd.source
    assert not FxRate.objects.filter(quote="CYP").exists()  # N/A: no rate
    call_command("fx_rates_import", str(path), stdout=out, stderr=io.StringIO())
    assert "0 created, 0 replaced, 8 already there" in out.getvalue()
    FxRate.objects.all().delete()
    call_command("fx_rates_import", str(path), "--currencies", "usd,gbp", stdout=out)
    assert set(FxRate.objects.values_list("quote", flat=True)) == {"USD", "GBP"}


def test_the_plain_layout_and_a_bad_row_that_imports_nothing(tmp_path, db):
    good = tmp_path / "rates.csv"
    good.write_text(
        "date,base,quote,rate,source\n"
        "2026-10-05,GBP,USD,1.2650,treasury\n"
        "2026-10-05,CHF,EUR,1.0601,\n"
    )
    call_command("fx_rates_import", str(good), "--source", "desk", stdout=io.StringIO())
    sources = dict(FxRate.objects.values_list("base", "source"))
    assert sources == {"GBP": "treasury", "CHF": "desk"}

    for body, where in (
        ("2026-10-06,GBP,USD,1.27\n2026-10-07,GBP,USD,abc\n", "line 3, rate: 'abc'"),
        ("2026-10-06,GBP,USD,1.27\n2026-10-07,GBP,GBP,1\n", "line 3, quote: must differ"),
        ("2026-10-06,GBP,USD,1.27\n2026-10-32,GBP,USD,1.2\n", "line 3, date: "),
        ("2026-10-06,GBP,USD,1.27\n2026-10-06,GBP,USD,1.28\n", "line 3, rate: GBP/USD"),
        ("2026-10-05,GBP,USD,1.3\n", "line 2, rate: GBP/USD on 2026-10-05 is stored as"),
    ):
        bad = tmp_path / "bad.csv"
        bad.write_text("date,base,quote,rate\n" + body)
        with pytest.raises(CommandError, match=f"{where}.*nothing imported"):
            call_command("fx_rates_import", str(bad), stdout=io.StringIO())
        assert FxRate.objects.count() == 2
    ecb = tmp_path / "ecb.csv"
    ecb.write_text("Date,USD,JPY\n2026-10-05,1.08,160\n2026-10-06,1.09,x\n")
    with pytest.raises(CommandError, match="line 3, JPY: 'x' is not a number"):
        call_command("fx_rates_import", str(ecb), stdout=io.StringIO())
    assert FxRate.objects.count() == 2
    with pytest.raises(CommandError, match="expected `date,base,quote,rate`"):
        (tmp_path / "odd.csv").write_text("when,what\n")
        call_command("fx_rates_import", str(tmp_path / "odd.csv"))


def test_the_admin_enters_a_rate_and_refuses_a_second_for_the_same_day(db):
    from django.contrib.auth import get_user_model
    from django.test import Client

    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "r@example.test", "pw"))
    form = {"base": "eur", "quote": "usd", "date": "2026-10-05", "rate": "1.0800", "source": "desk"}

    added = admin.post("/admin/billing/fxrate/add/", form)

    assert added.status_code == 302
    stored = FxRate.objects.get()
    assert (stored.base, stored.quote, stored.created_by.username) == ("EUR", "USD", "root")
    again = admin.post("/admin/billing/fxrate/add/", form | {"rate": "1.09"})
    assert again.status_code == 200 and "already exists" in again.content.decode()
    same = admin.post("/admin/billing/fxrate/add/", form | {"date": "2026-10-06", "quote": "EUR"})
    assert same.status_code == 200 and FxRate.objects.count() == 1
