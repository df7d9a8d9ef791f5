"""Finalizing drafts, and writing them; the one-tenant and the run's
paths (billing.invoicing.invoices) both come through here.

A period that has not ended is finalized only when asked to "finalize
early" with a reason (recorded on the invoice); otherwise it is refused
(409). One rule, `finalize_early_check`, for the invoice page, the API,
the invoice run and `manage.py invoice`.

Finalizing applies prepaid credit, then numbers: `invoices_number` is
the one numbering of invoices, a gapless block per issuer. `drafts_save`
is the one write of drafts, new or kept, moved on to finalized or paid
once their lines are in. Locks follow those the callers took (the
tenants, their invoices): each tenant's credit grants, then the issuers
by id, last and for the shortest time. A finalized invoice's Stripe sync
is queued by task name after the commit (billing.queueing), so invoicing
imports nothing of payments or of the tasks."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.utils import timezone

from billing.choices import InvoiceStatus, StripeSync
from billing.errors import BillingInputError, InvoicePeriodOpenError, TaxRateMissingError
from billing.invoicing.credits import credits_plan
from billing.invoicing.lines import LineDraft, credit_line
from billing.invoicing.notices import invoices_moved_emit
from billing.models import CreditApplication, Invoice, InvoiceLine, InvoiceRun, Issuer
from billing.queueing import invoice_sync_enqueue
from billing.spend.notices import credit_low_check
from billing.spend.wallet import wallet_balances_many
from billing.tax.rules import Treatment
from core.changes import terms_changed_of
from core.db_copy import copy_into, instances_create, model_copy_columns

# What finalizing sets on an invoice (credits_apply, number_assign); its
# status moves on apart (drafts_save).
FINAL_COLUMNS = [
    "total_minor",
    "sequence",
    "number",
    "finalized_at",
    "due_at",
    "stripe_sync",
    "paid_at",
    "finalized_early_reason",
    "finalized_early_by",
]


@dataclass(frozen=True)
class FinalizeEarly:
    """A request to finalize before the billing period ends: why, and who
    asked (a user name, or who ran the command)."""

    reason: str
    by: str


REASON_MAX = 300


def finalize_early_request(*, reason: str | None, by: str) -> FinalizeEarly:
    """A checked request to finalize early: a reason is required."""
    reason = (reason or "").strip()
    if not reason:
        raise BillingInputError("reason", "finalizing early needs a reason (it is recorded)")
    if len(reason) > REASON_MAX:
        raise BillingInputError("reason", f"at most {REASON_MAX} characters")
    return FinalizeEarly(reason=reason, by=(by or "unknown")[:200])


def finalize_early_check(
    *, period_start: datetime, period_end: datetime, now: datetime, early: FinalizeEarly | None
) -> FinalizeEarly | None:
    """The one rule for finalizing: a period that has ended is finalized
    as usual (None); one that has not is refused unless finalizing early
    was asked for, and then that request is what the invoice records."""
    if period_end <= now:
        return None
    if early is None:
        raise InvoicePeriodOpenError(period_start=period_start, period_end=period_end)
    return early


def issue_moment(run: InvoiceRun | None) -> datetime:
    """When invoices finalized now (by `run`) are issued: the run's
    `issued_at` (a backfill of past months), else now."""
    return run.issued_at if run is not None and run.issued_at else timezone.now()


def finalize_early_of_run(run: InvoiceRun | None) -> FinalizeEarly | None:
    if run is None or not run.finalize_early_reason:
        return None
    return FinalizeEarly(reason=run.finalize_early_reason, by=run.finalize_early_by)


@dataclass
class Draft:
    """An invoice being written as a draft: its row (new, or a draft kept),
    the lines to add from position `first` on, the credit it spends."""

    invoice: Invoice
    lines: list[LineDraft]
    first: int = 1
    applications: list[CreditApplication] = field(default_factory=list)


def drafts_finalize(
    drafts: list[Draft], *, now: datetime, early: FinalizeEarly | None, with_credit: set[int]
) -> dict[str, list[Invoice]]:
    """Drafts -> finalized, in memory: prepaid credit applied (a tenant
    holding grants has them locked, spends them, gets credit lines), then
    numbered; grouped by the status each moves on to (invoices_number)."""
    for draft in drafts:  # before anything is locked, spent or numbered
        untaxed_check(draft.invoice)
    credited = [d.invoice.tenant_id for d in drafts if d.invoice.tenant_id in with_credit]
    wallets = wallet_balances_many(tenant_ids=credited, lock=True) if credited else {}
    for draft in drafts:
        invoice = draft.invoice
        if invoice.tenant_id in with_credit:
            balances = wallets.get(invoice.tenant_id, [])
            draft.applications, credits = credits_apply(invoice, balances)
            draft.lines += credits
    return invoices_number([d.invoice for d in drafts], now=now, early=early)


def untaxed_check(invoice: Invoice) -> None:
    """A buyer in a country where tax is due and no rate is configured is
    not finalized (it was, with no tax and a warning: issue 60, finding 5):
    TaxRateMissingError names the country, for finance to add its rate and
    rate the draft again."""
    if invoice.tax_treatment == Treatment.RATE_MISSING:
        raise TaxRateMissingError(
            f"invoice {invoice} is for a buyer in {invoice.buyer_country}, where tax is due "
            "and no rate is configured: add one (/finance/tax/), then rate the draft again"
        )


def credits_apply(invoice: Invoice, balances) -> tuple[list, list[LineDraft]]:
    """Prepaid credit for the invoice: (applications, credit lines), the
    invoice's total reduced in memory."""
    applications, lines = [], []
    for grant, minor in credits_plan(
        invoice=invoice, balances=balances, due_minor=invoice.total_minor
    ):
        applications.append(CreditApplication(grant=grant, invoice=invoice, amount_minor=minor))
        lines.append(
            credit_line(
                grant=grant,
                minor=minor,
                currency=invoice.currency,
                start=invoice.period_start,
                end=invoice.period_end,
            )
        )
        invoice.total_minor -= minor
    return applications, lines


def invoices_number(
    invoices: list[Invoice], *, now: datetime, early: FinalizeEarly | None
) -> dict[str, list[Invoice]]:
    """The one numbering of invoices: per issuer (in id order), a block of
    consecutive numbers taken under the issuer's row lock until the
    transaction ends (a rollback gives them back), in the invoices' order.
    Each invoice is finalized in memory (number_assign) but stays a draft
    there until written (drafts_save); returned grouped by the status it
    moves on to."""
    by_issuer: dict[int, list[Invoice]] = defaultdict(list)
    for invoice in invoices:
        by_issuer[invoice.issuer_id].append(invoice)
    moves: dict[str, list[Invoice]] = defaultdict(list)
    for issuer_id in sorted(by_issuer):
        mine = by_issuer[issuer_id]
        issuer = Issuer.objects.select_for_update().get(pk=issuer_id)
        first = issuer.next_invoice_number
        Issuer.objects.filter(pk=issuer_id).update(next_invoice_number=first + len(mine))
        for n, invoice in enumerate(mine):
            number_assign(invoice, issuer=issuer, sequence=first + n, now=now, early=early)
            moves[invoice.status].append(invoice)
            invoice.status = InvoiceStatus.DRAFT
    return moves


def number_assign(
    invoice: Invoice,
    *,
    issuer: Issuer,
    sequence: int,
    now: datetime,
    early: FinalizeEarly | None = None,
) -> None:
    """Draft -> finalized, in memory: number, dates, Stripe status, and
    (its period not ended, checked by finalize_early_check) why early."""
    if invoice.period_end > now:
        if early is None:  # the callers check first; never number an open period silently
            raise InvoicePeriodOpenError(
                period_start=invoice.period_start, period_end=invoice.period_end
            )
        invoice.finalized_early_reason = early.reason
        invoice.finalized_early_by = early.by
    invoice.sequence = sequence
    invoice.number = f"{issuer.invoice_prefix}-{sequence:06d}"
    invoice.status = InvoiceStatus.FINALIZED
    invoice.finalized_at = now
    invoice.due_at = now + timedelta(days=settings.BILLING["NET_DAYS"])
    invoice.stripe_sync = StripeSync.PENDING if settings.STRIPE_API_KEY else StripeSync.NOT_SYNCED
    if invoice.total_minor == 0:  # covered by credit: nothing to collect
        invoice.status = InvoiceStatus.PAID
        invoice.paid_at = now


def lines_write(drafts: list[Draft]) -> None:
    """Every draft's lines in one binary COPY, each row checked by the
    table's constraints and its immutability trigger as an INSERT's is. A
    month's run writes about seven lines a tenant, and bulk_create spent
    more of the run preparing each field of each line in Python (and
    encoding them as arrays) than anything else (profiled)."""
    columns, types = model_copy_columns(InvoiceLine, connection)
    fields = columns[2:]  # after invoice_id and position: LineDraft's
    assert columns[:2] == ["invoice_id", "position"], columns
    rows = (
        (d.invoice.pk, n, *(getattr(line, name) for name in fields))
        for d in drafts
        for n, line in enumerate(d.lines, start=d.first)
    )
    with connection.cursor() as cursor, connection.wrap_database_errors:
        copy_into(
            cursor.cursor,
            table=InvoiceLine._meta.db_table,
            columns=columns,
            rows=rows,
            types=types,
        )


def drafts_save(
    drafts: list[Draft], *, moves: dict[str, list[Invoice]], columns: Iterable[str]
) -> None:
    """Write the drafts, new rows created and kept ones rewritten (the
    `columns` set on them), with their lines and the credit they spend,
    all as drafts (lines may only be added to a draft); then move the
    finalized on in one statement per status and queue their Stripe sync."""
    kept = [d.invoice for d in drafts if d.invoice.pk is not None]
    instances_create(Invoice, [d.invoice for d in drafts if d.invoice.pk is None], connection)
    if kept:
        Invoice.objects.bulk_update(kept, sorted(set(columns)), batch_size=1000)
    lines_write(drafts)
    CreditApplication.objects.bulk_create([a for d in drafts for a in d.applications])
    for status, moved in moves.items():
        Invoice.objects.filter(pk__in=[i.pk for i in moved]).update(status=status)
        for invoice in moved:
            invoice.status = status
            if invoice.stripe_sync == StripeSync.PENDING:
                invoice_sync_enqueue(invoice.pk)
    # Finalizing draws prepaid credit and closes the usage it bills: the
    # gateways reload these tenants' prepaid accounts.
    terms_changed_of({i.tenant_id for moved in moves.values() for i in moved})
    invoices_moved_emit(moves)
    credit_low_check(tenant_ids=[d.invoice.tenant_id for d in drafts if d.applications])
