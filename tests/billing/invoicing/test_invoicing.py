"""Invoices: lines rounded once and summing to the total, gapless numbers,
immutability enforced by the database, prepaid credit, credit notes, late
usage as an adjustment on the next invoice, and the run (all or nothing
per tenant, safe to repeat)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError, InternalError, transaction
from django.utils import timezone

from billing.choices import InvoiceStatus, LineKind
from billing.errors import BillingInputError, InvoiceStateError
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.finalizing import FinalizeEarly
from billing.invoicing.invoices import (
    invoice_amount_due_minor,
    invoice_bill_period,
    invoice_draft_build,
    invoice_finalize,
    invoice_transition,
)
from billing.invoicing.runs import invoice_run_create, invoice_run_execute
from billing.models import CreditGrant, Invoice, InvoiceLine, Plan, Subscription
from billing.pricing.periods import tenants_by_period
from billing.spend.wallet import wallet_balances
from tests.billing.conftest import NOV, OCT

D = Decimal
DEC = datetime(2026, 12, 1, tzinfo=UTC)
DB_REFUSES = (IntegrityError, InternalError)


def _october(world, tenant, **usage):
    world.tokens(tenant, hour=OCT + timedelta(hours=5), **usage)


def _invoice(tenant, start=OCT, end=NOV, finalize=True) -> Invoice:
    invoice, _ = invoice_draft_build(tenant=tenant, period_start=start, period_end=end)
    # A period still running (November, December) is finalized as of its end.
    at = max(end, timezone.now())
    return invoice_finalize(invoice_id=invoice.pk, now=at) if finalize else invoice


def test_each_line_is_rounded_once_and_the_lines_sum_to_the_total(world):
    world.price(input_per_mtok=D("0.003"), output_per_mtok=D("0.005"))
    # 1,500 input tokens at $0.003/M = $0.0000045 -> 0 cents; 2.5 M output at
    # $0.005/M = $0.0125 -> 1 cent (half-even); 1 M cached at $0.25 = 25 cents.
    _october(world, world.a, prompt=1_001_500, cached=1_000_000, completion=2_500_000)

    invoice = _invoice(world.a)

    lines = {line.token_kind: line for line in invoice.lines.all()}
    assert lines["input"].amount == D("0.0000045") and lines["input"].amount_minor == 0
    assert lines["output"].amount == D("0.0125") and lines["output"].amount_minor == 1
    assert lines["cached_input"].amount_minor == 25
    assert invoice.total_minor == 26 == sum(line.amount_minor for line in lines.values())
    assert invoice.currency == "USD"
    assert not Invoice.objects.filter(tenant=world.b).exists()  # Bravo used nothing


def test_finalizing_numbers_invoices_in_sequence_and_sets_the_due_date(world, settings):
    settings.BILLING = {**settings.BILLING, "NET_DAYS": 14}
    world.price()
    _october(world, world.a, completion=1_000_000)
    _october(world, world.b, completion=2_000_000)

    first, second = _invoice(world.a), _invoice(world.b)

    assert (first.number, second.number) == ("INV-000001", "INV-000002")
    assert first.status == InvoiceStatus.FINALIZED
    assert first.due_at == first.finalized_at + timedelta(days=14)
    assert invoice_amount_due_minor(second) == 800


def test_a_finalized_invoice_refuses_every_change(world):
    world.price()
    _october(world, world.a, completion=1_000_000)
    invoice = _invoice(world.a)
    line = invoice.lines.get()

    for change in (
        lambda: Invoice.objects.filter(pk=invoice.pk).update(total_minor=1),
        lambda: Invoice.objects.filter(pk=invoice.pk).update(status=InvoiceStatus.DRAFT),
        lambda: InvoiceLine.objects.filter(pk=line.pk).update(amount_minor=1),
        lambda: InvoiceLine.objects.filter(pk=line.pk).delete(),
        lambda: InvoiceLine.objects.create(
            invoice=invoice,
            position=9,
            kind=LineKind.TOKENS,
            description="extra",
            quantity=1,
            amount=1,
            amount_minor=100,
            service_start=OCT,
            service_end=NOV,
        ),
        lambda: Invoice.objects.filter(pk=invoice.pk).delete(),
    ):
        with pytest.raises(DB_REFUSES, match="finalized"), transaction.atomic():
            change()
    with pytest.raises(InvoiceStateError):
        invoice_finalize(invoice_id=invoice.pk)
    # Rebuilding the period leaves it alone.
    _october(world, world.a, completion=1_000_000)
    assert invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV) == (
        invoice,
        "final",
    )

    invoice.refresh_from_db()
    assert invoice.total_minor == 400 and invoice.lines.get().amount_minor == 400
    # Moving on is allowed; moving back is not.
    paid = invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.PAID)
    assert paid.status == InvoiceStatus.PAID and paid.paid_at is not None
    with pytest.raises(InvoiceStateError):
        invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.VOID)


def test_a_draft_is_rebuilt_with_new_usage_and_keeps_its_row(world):
    world.price()
    _october(world, world.a, completion=1_000_000)
    draft = _invoice(world.a, finalize=False)
    _october(world, world.a, completion=1_000_000)

    rebuilt, outcome = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)

    assert outcome == "rebuilt" and rebuilt.pk == draft.pk
    assert rebuilt.total_minor == 800 and rebuilt.number == ""
    assert Invoice.objects.count() == 1


def test_the_run_takes_the_one_tenant_path_drafts_keep_their_rows_credit_is_spent(
    world, monkeypatch
):
    """One path for one tenant and for a run: the run rebuilds a draft in
    place, spends prepaid credit as finalizing one invoice does, and a
    tenant whose rating fails keeps its draft as it was."""
    import billing.invoicing.invoices as invoices

    world.price()
    _october(world, world.a, completion=1_000_000)  # $4.00
    _october(world, world.b, completion=1_000_000)
    draft_a = _invoice(world.a, finalize=False)
    draft_b = _invoice(world.b, finalize=False)
    CreditGrant.objects.create(tenant=world.a, amount=D("1.5"), granted_at=OCT)
    _october(world, world.a, completion=1_000_000)  # $8.00 now
    real = invoices.charges_compute

    def broken_for_bravo(*, tenant, **kw):
        if tenant == world.b:
            raise RuntimeError("rating blew up")
        return real(tenant=tenant, **kw)

    monkeypatch.setattr(invoices, "charges_compute", broken_for_bravo)

    run = invoice_run_execute(run_id=invoice_run_create(as_of=NOV + timedelta(days=1)).pk)

    assert [f["tenant"] for f in run.failures] == [world.b.slug]
    alpha = Invoice.objects.get(tenant=world.a)
    assert (alpha.pk, alpha.number, alpha.total_minor) == (draft_a.pk, "INV-000001", 650)
    credit = alpha.lines.get(kind=LineKind.CREDIT)
    assert (credit.position, credit.amount_minor) == (2, -150)
    assert alpha.credit_applications.get().amount_minor == 150
    bravo = Invoice.objects.get(tenant=world.b)  # untouched: still the draft it was
    assert (bravo.pk, bravo.status, bravo.total_minor) == (draft_b.pk, "draft", 400)
    assert bravo.lines.count() == 1


def test_prepaid_credit_is_spent_soonest_expiry_first_and_returned_when_void(world):
    world.price()
    _october(world, world.a, completion=1_000_000)  # $4.00
    late = CreditGrant.objects.create(tenant=world.a, amount=D("3"), granted_at=OCT)
    soon = CreditGrant.objects.create(
        tenant=world.a, amount=D("1.5"), granted_at=OCT, expires_at=DEC
    )
    CreditGrant.objects.create(  # expired before October began: unusable
        tenant=world.a, amount=D("100"), granted_at=OCT - timedelta(days=60), expires_at=OCT
    )
    CreditGrant.objects.create(tenant=world.b, amount=D("100"), granted_at=OCT)  # not Alpha's

    invoice = _invoice(world.a)

    credit = [line for line in invoice.lines.all() if line.kind == LineKind.CREDIT]
    assert [line.amount_minor for line in credit] == [-150, -250]
    assert [a.grant_id for a in invoice.credit_applications.order_by("pk")] == [soon.pk, late.pk]
    assert invoice.total_minor == 0 == sum(line.amount_minor for line in invoice.lines.all())
    assert invoice.status == InvoiceStatus.PAID  # nothing left to collect

    assert wallet_total_minor(tenant=world.a, currency="USD") == 50 + 10000
    with pytest.raises(InvoiceStateError):  # paid invoices are not voided
        invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.VOID)


def test_voiding_returns_credit_to_the_wallet_and_frees_the_period(world):
    world.price()
    _october(world, world.a, completion=2_000_000)  # $8.00
    CreditGrant.objects.create(tenant=world.a, amount=D("5"), granted_at=OCT)
    invoice = _invoice(world.a)
    assert invoice.total_minor == 300

    assert wallet_total_minor(tenant=world.a, currency="USD") == 0
    invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.VOID)
    assert wallet_total_minor(tenant=world.a, currency="USD") == 500

    again = _invoice(world.a)
    assert again.pk != invoice.pk and again.number == "INV-000002"
    assert again.total_minor == 300


def test_credit_notes_reduce_what_is_due_and_refund_paid_invoices_to_the_wallet(world):
    world.price()
    _october(world, world.a, completion=2_500_000)  # $10.00
    invoice = _invoice(world.a)

    note = credit_note_create(invoice_id=invoice.pk, amount_minor=300, reason="outage credit")
    assert note.number == "CN-000001" and note.wallet_grant is None
    invoice.refresh_from_db()
    assert invoice_amount_due_minor(invoice) == 700
    with pytest.raises(BillingInputError) as error:
        credit_note_create(invoice_id=invoice.pk, amount_minor=701, reason="too much")
    assert error.value.field == "amount_minor"
    with pytest.raises(BillingInputError) as error:
        credit_note_create(invoice_id=invoice.pk, amount_minor=1, reason=" ")
    assert error.value.field == "reason"

    credit_note_create(invoice_id=invoice.pk, amount_minor=700, reason="the rest")
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID  # fully credited

    # A paid invoice's note becomes money in the wallet.
    _october(world, world.b, completion=1_000_000)
    paid = invoice_transition(invoice_id=_invoice(world.b).pk, to=InvoiceStatus.PAID)
    refund = credit_note_create(invoice_id=paid.pk, amount_minor=150, reason="goodwill")
    assert refund.number == "CN-000003"
    assert refund.wallet_grant.amount == D("1.50") and refund.wallet_grant.tenant == world.b
    with pytest.raises(DB_REFUSES), transaction.atomic():
        type(refund).objects.filter(pk=refund.pk).update(amount_minor=1)


def test_late_usage_lands_on_the_next_invoice_once(world):
    world.price()
    _october(world, world.a, completion=1_000_000)  # $4.00
    october = _invoice(world.a)
    # Two records for October arrive after it was invoiced.
    world.tokens(world.a, hour=OCT + timedelta(days=30), completion=500_000, prompt=1_000_000)
    world.tokens(world.a, hour=NOV + timedelta(hours=1), completion=250_000)  # November's own

    november = _invoice(world.a, start=NOV, end=DEC)

    late = [line for line in november.lines.all() if line.late]
    assert {(line.token_kind, line.amount_minor) for line in late} == {
        ("output", 200),
        ("input", 100),
    }
    assert all(line.service_start == OCT for line in late)
    assert "Late usage 2026-10-01 to 2026-11-01" in late[0].description
    assert november.total_minor == 100 + 300  # November's $1 + the late $3
    october.refresh_from_db()
    assert october.total_minor == 400  # untouched

    # December: October is settled now, nothing billed twice.
    world.tokens(world.a, hour=DEC + timedelta(hours=1), completion=250_000)
    december = _invoice(world.a, start=DEC, end=datetime(2027, 1, 1, tzinfo=UTC))
    assert not [line for line in december.lines.all() if line.late]
    assert december.total_minor == 100


def test_late_usage_under_a_commitment_reduces_the_true_up(world):
    world.price(output_per_mtok=D("10"))
    plan = Plan.objects.create(name="Commit", minimum_commit=D("100"))
    Subscription.objects.create(tenant=world.a, plan=plan, start=OCT)
    _october(world, world.a, completion=5_000_000)  # $50, topped up by $50
    _invoice(world.a)
    world.tokens(world.a, hour=OCT + timedelta(days=2), completion=2_000_000)  # $20 late

    november = _invoice(world.a, start=NOV, end=DEC)

    late = {line.kind: line.amount_minor for line in november.lines.all() if line.late}
    assert late == {"tokens": 2000, "commit_true_up": -2000}  # still $100 for October


def test_the_run_invoices_every_tenant_all_or_nothing_and_is_safe_to_repeat(world, monkeypatch):
    world.price()
    _october(world, world.a, completion=1_000_000)
    _october(world, world.b, completion=1_000_000)
    import billing.invoicing.invoices as invoices

    real = invoices.charges_compute

    def broken_for_bravo(*, tenant, **kw):
        if tenant == world.b:
            raise RuntimeError("rating blew up")
        return real(tenant=tenant, **kw)

    monkeypatch.setattr(invoices, "charges_compute", broken_for_bravo)
    run = invoice_run_create(as_of=NOV + timedelta(days=1))

    run = invoice_run_execute(run_id=run.pk)

    assert (run.status, run.tenants_total, run.tenants_done) == ("failed", 2, 2), run.failures
    assert [f["tenant"] for f in run.failures] == [world.b.slug]
    assert Invoice.objects.get(tenant=world.a).number == "INV-000001"
    assert not Invoice.objects.filter(tenant=world.b).exists()  # nothing half written
    monkeypatch.setattr(invoices, "charges_compute", real)

    again = invoice_run_execute(run_id=invoice_run_create(as_of=NOV + timedelta(days=2)).pk)

    assert again.status == "done" and again.invoices_skipped == 1 and again.invoices_created == 1
    assert sorted(Invoice.objects.values_list("number", flat=True)) == [
        "INV-000001",
        "INV-000002",
    ]


def test_the_period_follows_the_subscription_anchor_day(world):
    world.price()
    plan = Plan.objects.create(name="Mid-month")
    Subscription.objects.create(tenant=world.a, plan=plan, anchor_day=15, start=OCT)
    world.tokens(world.a, hour=datetime(2026, 10, 14, tzinfo=UTC), completion=1_000_000)
    world.tokens(world.a, hour=datetime(2026, 10, 20, tzinfo=UTC), completion=1_000_000)

    _, invoice = invoice_bill(tenant=world.a, as_of=datetime(2026, 11, 16, tzinfo=UTC))

    assert (invoice.period_start.date(), invoice.period_end.date()) == (
        datetime(2026, 10, 15).date(),
        datetime(2026, 11, 15).date(),
    )
    assert invoice.total_minor == 400  # only the 20th


@pytest.mark.django_db(transaction=True)
def test_invoice_numbers_have_no_gaps_under_concurrent_runs_and_rollbacks(world):
    from concurrent.futures import ThreadPoolExecutor

    from django.db import connection

    from billing.models import Issuer
    from tests.factories import make_tenant

    world.price()
    tenants = [world.a, world.b, *(make_tenant() for _ in range(10))]
    for tenant in tenants:
        _october(world, tenant, completion=1_000_000)
    doomed = {t.pk for t in tenants[::4]}  # these crash after taking a number

    def finalize_one(tenant):
        try:
            with transaction.atomic():
                invoice, _ = invoice_draft_build(tenant=tenant, period_start=OCT, period_end=NOV)
                invoice_finalize(invoice_id=invoice.pk)
                if tenant.pk in doomed:
                    raise RuntimeError("worker died after numbering")
        except RuntimeError:
            pass
        finally:
            connection.close()

    def run_all():
        try:
            return invoice_run_execute(run_id=invoice_run_create(as_of=NOV).pk).status
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(finalize_one, tenants))
        # Two runs at once over the survivors and the crashed ones.
        statuses = list(pool.map(lambda _: run_all(), range(2)))

    assert statuses == ["done", "done"]
    sequences = sorted(Invoice.objects.values_list("sequence", flat=True))
    assert sequences == list(range(1, len(tenants) + 1))  # one each, no gaps
    assert Issuer.objects.get(is_default=True).next_invoice_number == len(tenants) + 1


def test_a_chunk_that_fails_to_write_is_invoiced_tenant_by_tenant(world, monkeypatch):
    world.price()
    _october(world, world.a, completion=1_000_000)
    _october(world, world.b, completion=2_000_000)
    from billing.invoicing import finalizing

    real = finalizing.lines_write
    calls = []

    def fail_first(drafts, *args, **kwargs):
        calls.append(len(drafts))
        if len(calls) == 1:
            raise IntegrityError("simulated: the chunk's write failed")
        return real(drafts, *args, **kwargs)

    monkeypatch.setattr(finalizing, "lines_write", fail_first)

    run = invoice_run_execute(run_id=invoice_run_create(as_of=NOV + timedelta(days=1)).pk)

    assert (run.status, run.invoices_created) == ("done", 2), run.failures
    totals = dict(Invoice.objects.values_list("tenant__slug", "total_minor"))
    assert totals == {world.a.slug: 400, world.b.slug: 800}
    # The failed chunk took no numbers: the tenants' invoices are 1 and 2.
    assert sorted(Invoice.objects.values_list("sequence", flat=True)) == [1, 2]


def test_the_run_reads_and_writes_in_bulk_however_many_tenants(world):
    """Month two, with the late-usage check of month one: the run's queries
    do not grow with the number of tenants."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tests.factories import make_tenant

    world.price()

    def queries_for(tenants: int) -> int:
        people = [make_tenant() for _ in range(tenants)]
        for tenant in people:
            _october(world, tenant, completion=1_000_000)
            world.tokens(tenant, hour=NOV + timedelta(hours=1), completion=500_000)
        invoice_run_execute(run_id=invoice_run_create(as_of=NOV + timedelta(days=1)).pk)
        with CaptureQueriesContext(connection) as queries:
            december = invoice_run_create(
                as_of=DEC + timedelta(days=1), early=FinalizeEarly(reason="test", by="test")
            )  # November has not ended yet: finalized early
            run = invoice_run_execute(run_id=december.pk)
        november = Invoice.objects.filter(tenant__in=people, period_start=NOV)
        assert run.status == "done" and november.count() == tenants
        assert {i.total_minor for i in november} == {200}  # no late usage: nothing doubled
        return len(queries)

    assert queries_for(2) == queries_for(8)


def wallet_total_minor(*, tenant, currency: str) -> int:
    """What is left in the tenant's wallet in `currency`, in minor units."""
    return sum(
        b.remaining_minor for b in wallet_balances(tenant=tenant) if b.grant.currency == currency
    )


def invoice_bill(*, tenant, as_of):
    """One tenant's last closed period, built and finalized all or nothing:
    (outcome, invoice)."""
    ((start, end),) = tenants_by_period(tenants=[tenant], moment=as_of, closed=True)
    return invoice_bill_period(tenant=tenant, start=start, end=end, run=None, finalize=True)
