"""SLA credits on invoices, worked by hand: Alpha's October (one day of
requests, tests/slo.py: 87.5 % available, TTFT p95 190.5 ms) under the
shared tier's schedule (availability < 99.9 % 10 %, < 99 % 25 %; TTFT p95
over 150 ms 5 %) earns 25 % + 5 % of its usage charges. Re-runs do not
duplicate them; finance waives or adjusts them on drafts only, recorded
with who, when and why."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from billing.choices import LineKind
from billing.errors import BillingInputError, InvoiceStateError
from billing.invoicing.invoices import (
    invoice_draft_build,
    invoice_finalize,
    invoices_bill,
)
from billing.invoicing.sla_adjustments import sla_credit_adjust
from billing.models import Invoice, InvoiceLine, SlaCreditAdjustment
from tests.billing.conftest import NOV, OCT
from tests.factories import make_finance_user
from tests.ledger import T0
from tests.slo import slo_day, slo_policy

D = Decimal


@pytest.fixture
def october(world, ledger):
    """Alpha (the ledger's) used $1 of input and $10 of output tokens in
    October and had the day of tests/slo.py; Bravo used $4, no requests."""
    world.price()
    world.tokens(ledger.a, hour=OCT + timedelta(hours=1), prompt=1_000_000, completion=2_500_000)
    world.tokens(ledger.b, hour=OCT + timedelta(hours=1), completion=1_000_000)
    slo_day(ledger, ledger.a, T0)
    slo_policy()
    return ledger


def _sla_lines(invoice: Invoice) -> list[InvoiceLine]:
    return list(invoice.lines.filter(kind=LineKind.SLA_CREDIT).order_by("position"))


def test_the_credit_lines_name_the_figure_and_the_target(october):
    invoice, _ = invoice_draft_build(tenant=october.a, period_start=OCT, period_end=NOV)
    lines = _sla_lines(invoice)
    assert [(line.sla_metric, line.description, line.amount_minor) for line in lines] == [
        (
            "availability",
            "SLA credit: availability 87.50% < 99.00% (target 99.90%): 25% of usage charges "
            "(11.00 USD)",
            -275,  # 25 % of $11.00
        ),
        (
            "ttft_p95",
            "SLA credit: TTFT p95 190.5 ms > 150 ms target: 5% of usage charges (11.00 USD)",
            -55,  # 5 % of $11.00
        ),
    ]
    assert lines[0].amount == D("-2.75")
    assert (
        invoice.total_minor
        == 1100 - 275 - 55
        == sum(line.amount_minor for line in invoice.lines.all())
    )
    bravo, _ = invoice_draft_build(tenant=october.b, period_start=OCT, period_end=NOV)
    assert _sla_lines(bravo) == []  # no requests, nothing missed


def test_each_credit_line_is_rounded_once_half_to_even(world, ledger):
    world.price()
    world.tokens(ledger.a, hour=OCT + timedelta(hours=1), completion=125_000)  # $0.50
    slo_day(ledger, ledger.a, T0)
    slo_policy()
    invoice, _ = invoice_draft_build(tenant=ledger.a, period_start=OCT, period_end=NOV)
    # 25 % of $0.50 = 12.5 cents -> 12; 5 % = 2.5 cents -> 2 (half-up would give 13 and 3).
    assert [(line.amount, line.amount_minor) for line in _sla_lines(invoice)] == [
        (D("-0.125"), -12),
        (D("-0.025"), -2),
    ]
    assert invoice.total_minor == 50 - 12 - 2


def test_re_running_the_invoice_run_does_not_duplicate_the_credit(october):
    tenants = [october.a, october.b]
    for _ in range(2):
        invoices_bill(tenants=tenants, start=OCT, end=NOV, run=None, finalize=False)
    invoice = Invoice.objects.get(tenant=october.a, period_start=OCT)
    assert [line.amount_minor for line in _sla_lines(invoice)] == [-275, -55]
    (done, _) = invoices_bill(tenants=tenants, start=OCT, end=NOV, run=None, finalize=True)
    again, _ = invoices_bill(tenants=tenants, start=OCT, end=NOV, run=None, finalize=True)
    assert (done.outcome, again.outcome) == ("rebuilt", "final")
    assert [line.amount_minor for line in _sla_lines(again.invoice)] == [-275, -55]
    assert again.invoice.total_minor == 770


def test_a_waiver_removes_the_credit_and_records_who_when_and_why(october):
    finance = make_finance_user()
    invoice, _ = invoice_draft_build(tenant=october.a, period_start=OCT, period_end=NOV)
    waived = sla_credit_adjust(
        invoice_id=invoice.pk,
        metric="availability",
        action="waive",
        reason="planned maintenance, announced",
        by=finance,
    )
    invoice.refresh_from_db()
    assert [line.sla_metric for line in _sla_lines(invoice)] == ["ttft_p95"]
    assert invoice.total_minor == 1100 - 55
    row = SlaCreditAdjustment.objects.get()
    assert row == waived
    assert (row.tenant, row.period_start, row.metric, row.action) == (
        october.a,
        OCT,
        "availability",
        "waive",
    )
    assert (row.created_by, row.reason, row.credit_percent) == (
        finance,
        "planned maintenance, announced",
        None,
    )
    assert row.created_at is not None
    # A rebuild (a re-run) keeps the decision; a later one replaces it.
    invoice_draft_build(tenant=october.a, period_start=OCT, period_end=NOV)
    assert [line.sla_metric for line in _sla_lines(invoice)] == ["ttft_p95"]
    sla_credit_adjust(
        invoice_id=invoice.pk,
        metric="availability",
        action="adjust",
        credit_percent="15",
        reason="partly our fault",
        by=finance,
    )
    first = _sla_lines(invoice)[0]
    assert first.amount_minor == -165  # 15 % of $11.00
    assert first.description.endswith("15% of usage charges (11.00 USD, adjusted from 25%)")
    assert SlaCreditAdjustment.objects.count() == 2


def test_only_a_drafts_credit_can_be_adjusted(october):
    invoice, _ = invoice_draft_build(tenant=october.a, period_start=OCT, period_end=NOV)
    with pytest.raises(BillingInputError) as bad:
        sla_credit_adjust(invoice_id=invoice.pk, metric="itl_p95", action="waive", reason="x")
    assert bad.value.field == "metric"  # no such credit on it
    with pytest.raises(BillingInputError) as bad:
        sla_credit_adjust(invoice_id=invoice.pk, metric="availability", action="waive", reason=" ")
    assert bad.value.field == "reason"
    with pytest.raises(BillingInputError) as bad:
        sla_credit_adjust(
            invoice_id=invoice.pk, metric="availability", action="adjust", reason="r",
            credit_percent="101",
        )  # fmt: skip
    assert bad.value.field == "credit_percent"
    invoice_finalize(invoice_id=invoice.pk)
    with pytest.raises(InvoiceStateError):
        sla_credit_adjust(invoice_id=invoice.pk, metric="availability", action="waive", reason="r")
    assert SlaCreditAdjustment.objects.count() == 0
    assert [line.amount_minor for line in _sla_lines(invoice)] == [-275, -55]


def test_late_usage_does_not_revisit_an_sla_credit(world, october):
    """October is finalized with its credits; usage for it arriving later
    is billed on November as late usage, the credit left as it was."""
    october_invoice, _ = invoice_draft_build(tenant=october.a, period_start=OCT, period_end=NOV)
    invoice_finalize(invoice_id=october_invoice.pk)
    world.tokens(october.a, hour=OCT + timedelta(hours=2), completion=250_000)  # $1.00 late
    november, _ = invoice_draft_build(
        tenant=october.a, period_start=NOV, period_end=NOV + timedelta(days=30)
    )
    lines = list(november.lines.all())
    assert [(line.late, line.kind, line.amount_minor) for line in lines] == [(True, "tokens", 100)]


def test_no_policy_no_credit(world, ledger):
    world.price()
    world.tokens(ledger.a, hour=OCT + timedelta(hours=1), completion=1_000_000)
    slo_day(ledger, ledger.a, T0)
    slo_policy(rules=())  # targets, but no credit schedule
    invoice, _ = invoice_draft_build(tenant=ledger.a, period_start=OCT, period_end=NOV)
    assert _sla_lines(invoice) == [] and invoice.total_minor == 400
