"""Cost in other currencies: a GPU bought in euros and a
staff rate in euros are converted into the reporting currency (USD) at the
rate of each hour's day, the same dated rates revenue uses, and the margin
comes out as worked by hand; each pool-hour keeps the euro amount and the
rate beside the dollars. A currency that is not ISO 4217, or an amount no
GPU or data centre could have, is a 400 naming the field, nothing written."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest

from billing import tasks
from billing.choices import ReportKind, RunStatus
from billing.costs.runs import allocation_run_execute
from billing.models import CostRate, FxRate, PoolHourCost
from billing.reports.margin_reports import margin_report_build, margin_report_request
from serving.models import Gpu, GpuSku
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

D = Decimal
HOUR = timedelta(hours=1)
T0 = datetime(2026, 10, 5, 23, tzinfo=UTC)  # two hours across midnight: two days' rates
T1 = T0 + 2 * HOUR


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


def test_a_euro_gpu_and_euro_staff_cost_are_converted_hour_by_hour(
    finance, world, monkeypatch, client, django_capture_on_commit_callbacks
):
    """By hand, in USD (the reporting currency):
    The GPU: 8,760 EUR over the 8,760 hours of 2026 = 1.00 EUR an hour;
    staff 0.10 EUR per GPU-hour: 1.10 EUR an hour.
    EUR/USD 1.0800 on Oct 5, 1.0903 on Oct 6 (one hour of each):
      23:00 Oct 5: 1.10 x 1.0800 = 1.188000000 USD
      00:00 Oct 6: 1.10 x 1.0903 = 1.199330000 USD     cost 2.387330000 USD
    Alpha (USD) used half of the first hour:  0.5 x 1.188   = 0.594000000
    Euro Co (EUR) a quarter of the second:    0.25 x 1.19933 = 0.299832500
    Revenue (4 USD / M output tokens, rated in each tenant's currency):
      Alpha 1,000,000 tokens = 4.000000000 USD
      Euro Co 333,333 tokens = 1.333332 EUR x 1.08515 (the period's
        average rate) = 1.446865220 USD                 revenue 5.446865220
    Margin 5.446865220 - 2.387330000 = 3.059535220 USD
      Euro Co: 1.446865220 - 0.299832500 = 1.147032720"""
    world.price()
    world.price(currency="EUR")  # Euro Co's book
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    for day, rate in ((date(2026, 10, 5), "1.0800"), (date(2026, 10, 6), "1.0903")):
        FxRate.objects.create(base="EUR", quote="USD", date=day, rate=D(rate), source="test")
    created = finance.post(
        "/api/v1/fleet/gpus",
        {
            "serial": "g-eur",
            "sku": world.sku.pk,
            "node": world.node.pk,
            "in_service_date": "2026-01-01",
            "capex": "8760",
            "useful_life_months": 12,
            "currency": "EUR",
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [Gpu.objects.get(serial="g-eur")])
    world.rate("staff", "0.10", "per_gpu_hour", currency="EUR")
    world.use(world.a, replica, hour=T0, seconds=1800, completion=1_000_000)
    world.use(euro, replica, hour=T0 + HOUR, seconds=900, completion=333_333)

    sent: list[int] = []
    monkeypatch.setattr(tasks.allocation_run_task, "delay", sent.append)
    with django_capture_on_commit_callbacks(execute=True):
        queued = finance.post(
            "/api/v1/costs/runs", {"start": T0.isoformat(), "end": T1.isoformat()}, format="json"
        )
    assert queued.status_code == 202, queued.json()
    run = allocation_run_execute(run_id=sent[0])
    assert run.status == RunStatus.DONE, run.error

    hours = PoolHourCost.objects.filter(pool=pool).order_by("hour")
    assert [(h.total, h.capital, h.other_opex, h.currency) for h in hours] == [
        (D("1.188000000"), D("1.080000000"), D("0.108000000"), "USD"),
        (D("1.199330000"), D("1.090300000"), D("0.109030000"), "USD"),
    ]
    assert [h.original for h in hours] == [
        {"EUR": {"amount": "1.100000000", "rate": "1.08"}},
        {"EUR": {"amount": "1.100000000", "rate": "1.0903"}},
    ]

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.ADHOC, start=T0, end=T1).pk
    )
    assert report.status == RunStatus.DONE, report.error
    assert (report.totals["revenue"], report.totals["cost"], report.totals["margin"]) == (
        "5.446865220",
        "2.387330000",
        "3.059535220",
    )
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    by_tenant = {r["tenant"]: r for r in rows if r["level"] == "tenant"}
    assert (by_tenant[world.a.slug]["cost"], by_tenant[euro.slug]["cost"]) == (
        "0.594000000",
        "0.299832500",
    )
    assert by_tenant[euro.slug]["margin"] == "1.147032720"

    client.force_login(make_finance_user())
    totals = client.get("/finance/").content.decode().split('data-testid="totals"')[1]
    assert "2.39 USD" in totals.split("</p>")[0]


def test_a_day_without_a_rate_fails_the_allocation_naming_the_pair_and_the_day(world):
    FxRate.objects.create(
        base="EUR", quote="USD", date=date(2026, 10, 6), rate=D("1.0903"), source="test"
    )
    pool = world.pool("shared", policy="platform")
    world.replica("r1", pool, [world.gpu("g-eur", currency="EUR")])

    with pytest.raises(Exception, match="no EUR/USD exchange rate for 2026-10-05"):
        world.allocate(start=T0, end=T1)
    assert not PoolHourCost.objects.exists()  # never booked 1:1


RATE = {
    "component": "support",
    "basis": "per_gpu_month",
    "amount": "1000",
    "currency": "USD",
    "effective_from": "2026-11-27T12:00:00Z",
}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"currency": "ZZZ"}, "currency"),  # three letters, but no currency
        ({"currency": "0"}, "currency"),
        ({"currency": "usd "}, "currency"),
        ({"amount": "1000000000000"}, "amount"),  # a trillion a GPU-month
        ({"component": "pue", "basis": "ratio", "amount": "6213385738435"}, "amount"),
        ({"component": "pue", "basis": "ratio", "amount": "3.5"}, "amount"),
        ({"component": "energy", "basis": "per_kwh", "amount": "50000"}, "amount"),
    ],
)
def test_a_rate_in_no_currency_or_of_an_impossible_amount_is_a_400(finance, world, change, field):
    response = finance.post("/api/v1/costs/rates", RATE | change, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["field"] == field
    assert not CostRate.objects.exists()


def test_the_ceilings_say_their_unit(finance, world):
    pue = RATE | {"component": "pue", "basis": "ratio", "amount": "3.5"}
    tariff = RATE | {"component": "energy", "basis": "per_kwh", "amount": "50000"}
    messages = [
        finance.post("/api/v1/costs/rates", body, format="json").json()["error"]["message"]
        for body in (pue, tariff, RATE | {"amount": "2000000000"})
    ]
    assert messages == [
        "amount: a PUE is at most 3",
        "amount: at most 10,000 per kWh",
        "amount: at most 1,000,000,000 per GPU-month",
    ]


def test_a_pue_of_three_and_a_euro_rate_are_accepted(finance, world):
    pue = {"component": "pue", "basis": "ratio", "amount": "3"}
    assert finance.post("/api/v1/costs/rates", RATE | pue, format="json").status_code == 201
    euro = finance.post("/api/v1/costs/rates", RATE | {"currency": "EUR"}, format="json")
    assert euro.status_code == 201 and euro.json()["currency"] == "EUR"


SKU = {"name": "X-1", "memory_gb": 80, "power_idle_watts": 100, "power_busy_watts": 700}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"currency": "0"}, "currency"),
        ({"currency": "ZZZ"}, "currency"),
        ({"power_busy_watts": 70_000}, "power_busy_watts"),
        ({"memory_gb": 0}, "memory_gb"),
        ({"list_price": "6213385738435"}, "list_price"),
    ],
)
def test_a_gpu_sku_in_no_currency_or_beyond_physics_is_a_400(finance, world, change, field):
    before = GpuSku.objects.count()
    response = finance.post("/api/v1/fleet/gpu-skus", SKU | change, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["field"] == field
    assert GpuSku.objects.count() == before


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"currency": "ZZZ"}, "currency"),
        ({"useful_life_months": 600}, "useful_life_months"),
        ({"capex": None, "useful_life_months": None, "lease_rate_per_hour": "1e9"},
         "lease_rate_per_hour"),
    ],
)  # fmt: skip
def test_a_gpu_or_lease_in_no_currency_is_a_400(finance, world, change, field):
    body = {
        "serial": "g-x",
        "sku": world.sku.pk,
        "node": world.node.pk,
        "in_service_date": "2026-01-01",
        "capex": "30000",
        "useful_life_months": 48,
        "currency": "USD",
    } | change
    response = finance.post("/api/v1/fleet/gpus", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["error"]["field"] == field
    assert not Gpu.objects.filter(serial="g-x").exists()
