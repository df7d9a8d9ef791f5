"""SLA credits in margin reports: revenue given back, taken off revenue
and shown as lost revenue per tier and tenant, in the report of the
period in which the billing period ends."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

from billing.choices import ReportKind
from billing.invoicing.invoices import invoice_draft_build
from billing.reports.margin_reports import margin_report_build, margin_report_request
from billing.reports.margins import margin_data, margin_table
from tests.billing.conftest import NOV, OCT
from tests.ledger import T0
from tests.slo import slo_day, slo_policy

NANO = 10**9


def test_sla_credits_are_lost_revenue_per_tier(world, ledger):
    """Alpha's October: $11.00 of usage, credited 25 % + 5 % = $3.30
    (tests/billing/invoicing/test_sla_credits.py); Bravo's $4.00, none."""
    world.price()
    world.tokens(ledger.a, hour=OCT + timedelta(hours=1), prompt=1_000_000, completion=2_500_000)
    world.tokens(ledger.b, hour=OCT + timedelta(hours=1), completion=1_000_000)
    slo_day(ledger, ledger.a, T0)
    slo_policy()
    for tenant in (ledger.a, ledger.b):
        invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)

    data = margin_data(start=OCT, end=NOV)
    tier = margin_table(data, "tier").set_index("tier").loc["shared"]
    assert tier["sla_credit"] == 330 * NANO // 100
    assert tier["revenue"] == (1100 + 400 - 330) * NANO // 100  # net of the credit
    assert tier["margin"] == tier["revenue"]  # no cost booked
    tenants = margin_table(data, "tenant").set_index("tenant")
    assert tenants.loc[ledger.a.slug, "sla_credit"] == 330 * NANO // 100
    assert tenants.loc[ledger.b.slug, "sla_credit"] == 0
    # November's report: October's credit is not in it.
    after = margin_table(margin_data(start=NOV, end=NOV + timedelta(days=30)), "tier")
    assert after["sla_credit"].sum() == 0

    report = margin_report_build(
        report_id=margin_report_request(kind=ReportKind.CLOSE, start=OCT, end=NOV).pk
    )
    rows = list(csv.DictReader(io.StringIO(report.csv)))
    shared = next(r for r in rows if r["level"] == "tier" and r["tier"] == "shared")
    assert (shared["sla_credit"], shared["revenue"]) == ("3.300000000", "11.700000000")
    assert report.tables["tier"][0]["sla_credit"] == "3.30"
    assert "SLA credits (lost)" in report.html
