"""GET /api/v1/usage/focus: the FOCUS 1.2 export a FinOps tool loads.
Two tenants in two currencies; October invoiced (a plan's discount and
commitment true-up, a reservation fee, prepaid credit, a credit note),
November still running (its usage, and October's late usage, rated as they
stand). Every row carries its cost; summed per InvoiceId, BilledCost is
the invoice to the cent; the rows meet FOCUS's column rules (tests/focus.py)
and the FinOps Foundation's validator, in CSV and in Parquet; the fleet's
own cost is finance's alone."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pandas as pd
import pytest

from billing.choices import InvoiceStatus
from billing.costs.closing import cost_period_reopen
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.invoices import invoice_draft_build, invoice_estimate, invoice_finalize
from billing.models import Invoice, Plan, PoolHourCost, Subscription
from billing.money import from_minor
from billing.spend.wallet import credit_grant_create
from tenants.choices import Scope
from tests.billing.conftest import H0, NOV, OCT
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key
from tests.focus import focus_problems, read_focus_csv, read_focus_parquet
from tests.focus_validator import focus_validate

FOCUS = "/api/v1/usage/focus"
RANGE = {"start": "2026-10-01", "end": "2026-12-01"}
NOW_IN_NOVEMBER = NOV + timedelta(days=10)


def day(n: int) -> datetime:
    return datetime(2026, 10, n, tzinfo=UTC)


@pytest.fixture
def billed(world, settings):
    """Alpha (USD, a plan) and Bravo (EUR) invoiced for October; November
    running. What is billed is the product's own invoicing."""
    world.b.billing_currency = "EUR"
    world.b.save(update_fields=["billing_currency"])
    world.price(reservation=Decimal("0.5"))
    world.price(reservation=Decimal("0.5"), currency="EUR")  # Bravo's book
    plan = Plan.objects.create(
        name="growth", discount_percent=Decimal(10), minimum_commit=Decimal(500)
    )
    Subscription.objects.create(tenant=world.a, plan=plan, start=OCT - timedelta(days=31))
    world.reserve(world.a, world.pool("reserved"), 1)  # 30 days from 4 Oct, 12:00
    credit_grant_create(tenant=world.a, amount=Decimal(20), granted_at=OCT, note="welcome")
    hour = OCT + timedelta(days=2)
    world.tokens(world.a, hour=hour, prompt=3_000_000, cached=1_000_000, completion=1_500_000)
    world.tokens(world.b, hour=hour, prompt=1_000_000, completion=2_000_001)
    invoices = {}
    for tenant in (world.a, world.b):
        draft, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
        invoices[tenant.slug] = invoice_finalize(invoice_id=draft.pk)
    note = credit_note_create(
        invoice_id=invoices[world.b.slug].pk, amount_minor=150, reason="goodwill"
    )
    # After the invoices: October's late usage, and November's own.
    world.tokens(world.a, hour=hour + timedelta(hours=1), completion=250_000)
    world.tokens(world.a, hour=NOV + timedelta(days=1), prompt=2_000_000, completion=500_000)
    return world, invoices, note


def finance():
    return client_for_user(make_finance_user())


def tenant_client(tenant):
    _key, secret = make_key(tenant, scopes=(Scope.USAGE_READ,))
    return client_for_key(secret)


def export(client, **params) -> pd.DataFrame:
    response = client.get(FOCUS, {**RANGE, **params})
    assert response.status_code == 200, response.content[:500]
    if params.get("format") == "parquet":
        assert response["Content-Type"] == "application/vnd.apache.parquet"
        return read_focus_parquet(response.content)
    assert response["Content-Type"] == "text/csv"
    return read_focus_csv(b"".join(response.streaming_content))


@pytest.fixture
def now_in_november(monkeypatch):
    from django.utils import timezone

    monkeypatch.setattr(timezone, "now", lambda: NOW_IN_NOVEMBER)


def test_billed_cost_sums_to_each_invoice_and_credit_note_to_the_cent(billed, now_in_november):
    world, invoices, note = billed
    rows = export(finance())
    invoiced = rows[rows["x_BillingStatus"] == "invoiced"]
    sums: dict[str, Decimal] = defaultdict(Decimal)
    for invoice_id, cost in zip(invoiced["InvoiceId"], invoiced["BilledCost"], strict=True):
        sums[invoice_id] += cost
    expected = {i.number: from_minor(i.total_minor, i.currency) for i in invoices.values()} | {
        note.number: -from_minor(150, "EUR")
    }
    assert dict(sums) == expected
    # One currency per invoice, the tenant's: never added together.
    currencies = invoiced.groupby("InvoiceId")["BillingCurrency"].unique()
    assert {k: list(v) for k, v in currencies.items()} == {
        invoices[world.a.slug].number: ["USD"],
        invoices[world.b.slug].number: ["EUR"],
        note.number: ["EUR"],
    }
    assert not focus_problems(rows)


def test_each_kind_of_line_has_its_charge_category_and_class(billed, now_in_november):
    world, invoices, note = billed
    rows = export(tenant_client(world.a))
    october = rows[rows["InvoiceId"] == invoices[world.a.slug].number]
    kinds = {
        (r.ChargeCategory, r.ChargeClass, r.ChargeFrequency, r.SkuId) for r in october.itertuples()
    }
    assert kinds == {
        ("Usage", None, "Usage-Based", "tiny/input"),
        ("Usage", None, "Usage-Based", "tiny/cached_input"),
        ("Usage", None, "Usage-Based", "tiny/output"),
        ("Usage", None, "Recurring", "reservation"),  # capacity held this period
        ("Credit", None, "Usage-Based", None),  # the plan's 10% off usage
        ("Adjustment", None, "Recurring", None),  # topped up to the 500 committed
        ("Credit", None, "One-Time", None),  # prepaid credit applied
    }
    output = october[october["SkuId"] == "tiny/output"].iloc[0]
    # 1.5M output tokens at the book's $4 per million: list = contracted.
    assert output.PricingQuantity == Decimal("1.5")
    assert (output.ConsumedQuantity, output.ConsumedUnit) == (Decimal(1_500_000), "Tokens")
    assert output.ListUnitPrice == output.ContractedUnitPrice == Decimal(4)
    assert output.PricingUnit == "1000000 Tokens"
    assert output.ListCost == output.ContractedCost == output.BilledCost == Decimal(6)
    discount = october[october["ChargeDescription"].str.contains("off usage")].iloc[0]
    usage_list = october[october["SkuId"].str.startswith("tiny/", na=False)]["ListCost"].sum()
    assert (
        discount.BilledCost
        == discount.ContractedCost
        == -(usage_list / 10).quantize(Decimal("0.01"))
    )
    # The other tenant's credit note: a Correction of its own invoice.
    (credit,) = export(tenant_client(world.b)).query("ChargeClass == 'Correction'").itertuples()
    assert (credit.ChargeCategory, credit.InvoiceId, credit.BilledCost) == (
        "Credit",
        note.number,
        Decimal("-1.50"),
    )
    assert (credit.BillingPeriodStart, credit.ChargePeriodStart) == (OCT, OCT)


def test_a_period_not_yet_invoiced_is_rated_as_it_stands_and_marked(billed, now_in_november):
    world, _invoices, _note = billed
    rows = export(tenant_client(world.a))
    unbilled = rows[rows["x_BillingStatus"] == "unbilled"]
    assert set(unbilled["InvoiceId"]) == {f"provisional-{world.a.slug}-20261101"}
    assert set(unbilled["BillingPeriodStart"]) == {NOV}
    estimate = invoice_estimate(tenant=world.a, now=NOW_IN_NOVEMBER)
    assert unbilled["BilledCost"].sum() == from_minor(estimate.total_minor, "USD")
    # October's late usage (250k output tokens at $4/M) is billed in
    # November as a correction whose charge period is October.
    (late,) = unbilled.query("ChargeClass == 'Correction' and SkuId == 'tiny/output'").itertuples()
    assert (late.ChargePeriodStart, late.ChargePeriodEnd, late.BilledCost) == (
        OCT,
        NOV,
        Decimal("1.00"),
    )
    assert late.ChargeCategory == "Usage"
    # Rated again, October's discount and true-up moved too: corrections.
    moved = unbilled.query("ChargeClass == 'Correction' and ChargeCategory != 'Usage'")
    assert set(moved["ChargeCategory"]) == {"Credit", "Adjustment"}
    assert not Invoice.objects.filter(period_start=NOV).exists()  # nothing written


def test_a_tenant_sees_only_its_own_rows_and_finance_one_or_all(billed, now_in_november):
    world, _invoices, _note = billed
    assert set(export(tenant_client(world.b))["BillingAccountId"]) == {world.b.slug}
    assert set(export(finance())["BillingAccountId"]) == {world.a.slug, world.b.slug}
    assert set(export(finance(), tenant=world.a.slug)["BillingAccountId"]) == {world.a.slug}
    other = tenant_client(world.b).get(FOCUS, {**RANGE, "tenant": world.a.slug})
    assert other.status_code == 404


def test_parquet_holds_the_same_rows_as_csv_with_exact_decimals(billed, now_in_november):
    csv_rows = export(finance())
    parquet_rows = export(finance(), format="parquet")
    assert list(parquet_rows.columns) == list(csv_rows.columns)
    assert parquet_rows.equals(csv_rows)
    assert not focus_problems(parquet_rows)


def test_a_void_invoice_is_left_out_and_its_period_rated_again(billed, now_in_november):
    world, invoices, _note = billed
    from billing.invoicing.invoices import invoice_status_set

    invoice_status_set(invoice_id=invoices[world.a.slug].pk, to=InvoiceStatus.VOID)
    rows = export(tenant_client(world.a))
    assert invoices[world.a.slug].number not in set(rows["InvoiceId"].dropna())
    october = rows[rows["BillingPeriodStart"] == OCT]
    assert set(october["x_BillingStatus"]) == {"unbilled"}
    assert october["BilledCost"].sum() > 0


def test_the_fleet_dataset_is_each_gpus_cost_as_allocation_books_it(billed, now_in_november):
    world, _invoices, _note = billed
    pool = world.pool("fleet-pool")
    cheap, dear = world.gpu("g1"), world.gpu("g2", capex="17520")  # $1 and $2 an hour
    replica = world.replica("r1", pool, [cheap, dear])
    # October is invoiced (closed for cost): the tariff entered late needs it reopened.
    cost_period_reopen(start=OCT.replace(month=1), end=NOV, reason="tariff entered late")
    world.rate("energy", "0.10", "per_kwh")
    world.use(world.a, replica, 1800)
    day = H0.replace(hour=0)
    world.allocate(start=day, end=day + timedelta(days=1))
    rows = export(finance(), dataset="fleet")
    assert set(rows["x_BillingStatus"]) == {"cost"}
    assert set(rows["ResourceType"]) == {"GPU"}
    assert rows["ChargePeriodStart"].max() < NOW_IN_NOVEMBER  # nothing not yet incurred
    on_the_day = rows[rows["ChargePeriodStart"] == day]
    capital = on_the_day[on_the_day["SkuId"] == "gpu-capital"].set_index("ResourceName")
    assert capital.loc["g1", "PricingQuantity"] == Decimal(24)
    assert capital.loc["g1", "PricingUnit"] == "GPU-Hours"
    assert (capital.loc["g1", "BilledCost"], capital.loc["g2", "BilledCost"]) == (24, 48)
    assert capital.loc["g2", "ListUnitPrice"] == Decimal(2)
    # Summed over the pool's GPUs, the day is what the allocation run booked.
    booked = PoolHourCost.objects.filter(scenario=None, pool=pool)
    assert len(booked) == 24
    assert on_the_day["BilledCost"].sum() == sum(
        (r.capital + r.energy + r.other_opex for r in booked), Decimal(0)
    )
    assert set(on_the_day["Tags"]) == {'{"pool": "fleet-pool", "pool_kind": "shared"}'}
    assert not focus_problems(rows)
    refused = tenant_client(world.a).get(FOCUS, {**RANGE, "dataset": "fleet"})
    assert refused.status_code == 403


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2026-10-06", "end": "2026-10-05"}, "end"),
        ({"start": "2020-01-01", "end": "2026-10-05"}, "end"),
        ({**RANGE, "format": "xml"}, "format"),
        ({**RANGE, "format": "json"}, "format"),
        ({**RANGE, "dataset": "everything"}, "dataset"),
        ({**RANGE, "tenant": ""}, "tenant"),
        ({"end": "2026-10-05"}, "start"),
    ],
)
def test_bad_parameters_are_400_naming_the_field(billed, params, field):
    world, _invoices, _note = billed
    response = tenant_client(world.a).get(FOCUS, params)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["field"] == field


@pytest.mark.parametrize("data_format", ["csv", "parquet"])
def test_the_finops_foundations_validator_accepts_both_datasets(
    billed, now_in_november, validator, tmp_path, data_format
):
    """What a FinOps tool that checks its input runs on the files
    (tests/focus_validator.py installs it)."""
    world, _invoices, _note = billed
    pool = world.pool("fleet-pool")
    world.use(world.a, world.replica("r1", pool, [world.gpu("g1")]), 900)
    world.allocate()
    for dataset in ("billing", "fleet"):
        response = finance().get(FOCUS, {**RANGE, "dataset": dataset, "format": data_format})
        assert response.status_code == 200
        body = b"".join(response.streaming_content) if response.streaming else response.content
        data = tmp_path / f"{dataset}.{data_format}"
        data.write_bytes(body)
        validation = focus_validate(validator, data, data_format=data_format)
        assert not validation.failed, "\n".join(validation.failed)
        assert validation.passed >= 100, validation.report[-3000:]  # it did check


def test_late_usage_is_carried_once_by_the_first_period_not_yet_invoiced(billed, monkeypatch):
    """October invoiced, November ended but not invoiced yet, December
    running: both drafts find October's late usage; the next invoice
    (November's) bills it, so only November's rows carry it."""
    from django.utils import timezone

    world, _invoices, _note = billed
    monkeypatch.setattr(timezone, "now", lambda: datetime(2026, 12, 10, tzinfo=UTC))
    rows = export(tenant_client(world.a), end="2027-01-01")
    late = rows.query("ChargeClass == 'Correction' and SkuId == 'tiny/output'")
    assert list(late["BillingPeriodStart"]) == [NOV]
    assert set(rows[rows["x_BillingStatus"] == "unbilled"]["BillingPeriodStart"]) == {
        NOV,
        datetime(2026, 12, 1, tzinfo=UTC),
    }


def test_fleet_days_are_utc_days_cut_to_the_range(billed, now_in_november):
    world, _invoices, _note = billed
    world.replica("r1", world.pool("fleet-pool"), [world.gpu("g1")])
    rows = export(finance(), dataset="fleet", start="2026-10-05T12:30:00Z", end="2026-10-07")
    keys = list(zip(rows["ResourceId"], rows["ChargePeriodStart"], rows["SkuId"], strict=True))
    assert len(keys) == len(set(keys))  # one row per GPU, day and component
    capital = rows[rows["SkuId"] == "gpu-capital"]
    first = day(5) + timedelta(hours=12)  # the range's start, to its hour
    assert list(capital["ChargePeriodStart"]) == [first, day(6)]
    assert list(capital["ChargePeriodEnd"]) == [day(6), day(7)]
    assert list(capital["PricingQuantity"]) == [Decimal(12), Decimal(24)]
