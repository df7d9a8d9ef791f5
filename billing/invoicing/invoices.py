"""Invoices: build a tenant's draft for a period, finalize it (a gapless
number, prepaid credit applied, immutable from then on), move it on to
paid, void or uncollectible.

A period that has not ended is finalized only when asked to "finalize
early" with a reason (recorded on the invoice); otherwise it is refused
(409). One rule, `finalize_early_check`, for the invoice page, the API,
the invoice run and `manage.py invoice`.

Locks are always taken in one order: the tenant, the invoice, the
tenant's credit grants, the issuer last (held for the shortest time, as
every finalization in the issuer's sequence waits for it)."""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.choices import INVOICE_TRANSITIONS, InvoiceStatus, StripeSync
from billing.errors import BillingInputError, InvoicePeriodOpenError, InvoiceStateError
from billing.invoicing.credits import credits_plan, wallet_balances
from billing.invoicing.late_usage import EarlierPeriods, late_usage_lines
from billing.invoicing.lines import LineDraft, credit_line, lines_from_charges
from billing.models import CreditApplication, Invoice, InvoiceLine, InvoiceRun, Issuer
from billing.payments.sync import sync_enqueue
from billing.pricing.periods import tenant_period
from billing.pricing.rating import TenantInputs, charges_compute, rating_inputs, rating_session
from tenants.models import Tenant

TIMESTAMP_OF = {
    InvoiceStatus.PAID: "paid_at",
    InvoiceStatus.VOID: "voided_at",
    InvoiceStatus.UNCOLLECTIBLE: "uncollectible_at",
}


_issuer_cache: ContextVar[dict | None] = ContextVar("issuer_cache", default=None)


@contextmanager
def invoicing_session():
    """For a run over many tenants: price books and the default issuer are
    read once, not once per tenant."""
    token = _issuer_cache.set({})
    try:
        with rating_session():
            yield
    finally:
        _issuer_cache.reset(token)


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


def finalize_early_of_run(run: InvoiceRun | None) -> FinalizeEarly | None:
    if run is None or not run.finalize_early_reason:
        return None
    return FinalizeEarly(reason=run.finalize_early_reason, by=run.finalize_early_by)


@dataclass
class DraftContent:
    """What a tenant's invoice for a period says, before it is written."""

    lines: list[LineDraft]
    fingerprints: dict
    warnings: list[str]
    issuer_id: int

    @property
    def total_minor(self) -> int:
        return sum(line.amount_minor for line in self.lines)


def draft_compose(
    *,
    tenant: Tenant,
    start: datetime,
    end: datetime,
    inputs: TenantInputs,
    earlier: EarlierPeriods | None = None,
) -> DraftContent | None:
    """Rate the period and check earlier ones for late usage; None when
    there is nothing to bill. Shared by the one-invoice path and the run."""
    currency = tenant.billing_currency
    warnings: list[str] = []
    charges = charges_compute(tenant=tenant, start=start, end=end, inputs=inputs, warnings=warnings)
    lines = lines_from_charges(charges, currency=currency, start=start, end=end)
    late, fingerprints = late_usage_lines(
        tenant=tenant, before=start, currency=currency, earlier=earlier
    )
    lines += late
    if not lines:
        return None
    subscription = inputs.subscription
    issuer_id = subscription.issuer_id if subscription and subscription.issuer_id else None
    return DraftContent(
        lines=lines,
        fingerprints={start.isoformat(): inputs.fingerprint(), **fingerprints},
        warnings=warnings,
        issuer_id=issuer_id or issuer_default().pk,
    )


def invoice_draft_build(
    *,
    tenant: Tenant,
    period_start: datetime,
    period_end: datetime,
    run: InvoiceRun | None = None,
) -> tuple[Invoice | None, str]:
    """The tenant's draft for the period, rated now: (invoice, outcome),
    outcome one of created | rebuilt | final (already finalized, left as it
    is) | empty (nothing to bill). Runs in the caller's transaction or its
    own; a failure writes nothing."""
    with transaction.atomic():
        Tenant.objects.select_for_update().only("pk").get(pk=tenant.pk)
        invoice = (
            Invoice.objects.select_for_update()
            .filter(tenant=tenant, period_start=period_start)
            .exclude(status=InvoiceStatus.VOID)
            .first()
        )
        if invoice is not None and invoice.is_final:
            return invoice, "final"
        inputs = rating_inputs(tenants=[tenant], start=period_start, end=period_end)[tenant.pk]
        content = draft_compose(tenant=tenant, start=period_start, end=period_end, inputs=inputs)
        if content is None:
            if invoice is not None:
                invoice.delete()
            return None, "empty"
        outcome = "rebuilt" if invoice is not None else "created"
        if invoice is None:
            invoice = Invoice(tenant=tenant, period_start=period_start, period_end=period_end)
        else:
            invoice.lines.all().delete()
        draft_fill(invoice, content, run=run)
        invoice.save()
        lines_write(invoice, content.lines)
        return invoice, outcome


def invoice_bill_period(
    *, tenant: Tenant, start: datetime, end: datetime, run: InvoiceRun | None, finalize: bool
) -> tuple[str, Invoice | None]:
    """One tenant's period built and (if asked) finalized, all or nothing:
    (outcome, invoice)."""
    with transaction.atomic():
        invoice, outcome = invoice_draft_build(
            tenant=tenant, period_start=start, period_end=end, run=run
        )
        if invoice is not None and outcome != "final" and finalize:
            invoice = invoice_finalize(invoice_id=invoice.pk, early=finalize_early_of_run(run))
    return outcome, invoice


def draft_fill(invoice: Invoice, content: DraftContent, *, run: InvoiceRun | None) -> None:
    invoice.issuer_id = content.issuer_id
    invoice.run = run
    invoice.currency = invoice.tenant.billing_currency
    invoice.rated_at = timezone.now()
    invoice.usage_fingerprint = content.fingerprints
    invoice.warnings = content.warnings
    invoice.total_minor = content.total_minor


def issuer_default() -> Issuer:
    """The default issuer (created by a migration; again here if removed)."""
    cache = _issuer_cache.get()
    if cache is not None and "default" in cache:
        return cache["default"]
    issuer, _ = Issuer.objects.get_or_create(
        is_default=True, defaults={"name": "GPU Ledger Platform"}
    )
    if cache is not None:
        cache["default"] = issuer
    return issuer


def numbers_take(*, issuer_id: int, count: int) -> tuple[Issuer, int]:
    """Take `count` consecutive invoice numbers from the issuer, under its
    row lock until the transaction ends (a rollback gives them back): the
    issuer and the first number."""
    issuer = Issuer.objects.select_for_update().get(pk=issuer_id)
    first = issuer.next_invoice_number
    Issuer.objects.filter(pk=issuer_id).update(next_invoice_number=first + count)
    return issuer, first


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


def invoice_finalize(
    *, invoice_id: int, now: datetime | None = None, early: FinalizeEarly | None = None
) -> Invoice:
    """Draft → finalized: apply prepaid credit, take the issuer's next
    number, fix the due date. From here the invoice never changes. A
    period that has not ended needs `early` (else InvoicePeriodOpenError,
    before anything is written or numbered)."""
    now = now or timezone.now()
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().select_related("tenant").get(pk=invoice_id)
        if invoice.status != InvoiceStatus.DRAFT:
            raise InvoiceStateError(f"invoice {invoice} is {invoice.status}, not a draft")
        early = finalize_early_check(
            period_start=invoice.period_start, period_end=invoice.period_end, now=now, early=early
        )
        balances = wallet_balances(tenant=invoice.tenant, lock=True)
        applications, credits = credits_apply(invoice, balances)
        CreditApplication.objects.bulk_create(applications)
        lines_write(invoice, credits, first=invoice.lines.count() + 1)
        issuer, sequence = numbers_take(issuer_id=invoice.issuer_id, count=1)
        number_assign(invoice, issuer=issuer, sequence=sequence, now=now, early=early)
        invoice.save()
        if invoice.stripe_sync == StripeSync.PENDING:
            sync_enqueue(invoice.pk)
    return invoice


def invoice_status_set(*, invoice_id: int, to: str, early: FinalizeEarly | None = None) -> Invoice:
    """What finance staff ask for: finalize a draft (early, with a reason,
    when its period has not ended), or move a finalized invoice to paid,
    void or uncollectible."""
    if to == InvoiceStatus.FINALIZED:
        return invoice_finalize(invoice_id=invoice_id, early=early)
    if early is not None:
        raise BillingInputError("finalize_early", "only a draft being finalized is finalized early")
    return invoice_transition(invoice_id=invoice_id, to=to)


def invoice_transition(
    *, invoice_id: int, to: str, at: datetime | None = None, from_stripe: bool = False
) -> Invoice:
    """Finalized → paid | void | uncollectible (uncollectible → paid | void).
    Moving to the state it is already in changes nothing (a webhook
    delivered twice). A change made here, not learned from Stripe, is
    pushed to Stripe."""
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.status == to:
            return invoice
        if to not in INVOICE_TRANSITIONS[InvoiceStatus(invoice.status)]:
            raise InvoiceStateError(f"invoice {invoice} is {invoice.status}: it cannot become {to}")
        invoice.status = to
        setattr(invoice, TIMESTAMP_OF[InvoiceStatus(to)], at or timezone.now())
        fields = ["status", TIMESTAMP_OF[InvoiceStatus(to)]]
        if from_stripe:
            invoice.stripe_status = to
        elif invoice.stripe_sync != StripeSync.NOT_SYNCED:
            invoice.stripe_sync = StripeSync.PENDING
            sync_enqueue(invoice.pk)
        invoice.save(update_fields=[*fields, "stripe_status", "stripe_sync"])
    return invoice


def invoice_amount_due_minor(invoice: Invoice) -> int:
    """What is still to collect: the total less credit notes, nothing once
    paid, void or uncollectible. A draft's is its total (what it would ask
    for if finalized now; prepaid credit is applied when it is finalized)."""
    if invoice.status == InvoiceStatus.DRAFT:
        return invoice.total_minor
    if invoice.status != InvoiceStatus.FINALIZED:
        return 0
    credited = sum(note.amount_minor for note in invoice.credit_notes.all())
    return max(invoice.total_minor - credited, 0)


@dataclass(frozen=True)
class InvoiceEstimate:
    """The current period's invoice as it would be built now: usage so far
    rated, plus the period's fixed fees (reservations, dedicated GPUs),
    the commitment true-up and late usage; before prepaid credit. When the
    period's invoice is already issued (finalized early), that invoice."""

    period_start: datetime
    period_end: datetime
    currency: str
    total_minor: int
    as_of: datetime
    issued: Invoice | None = None


def invoice_estimate(*, tenant: Tenant, now: datetime | None = None) -> InvoiceEstimate:
    """What the tenant's invoice for the running period comes to so far
    (read only: rated like a draft, nothing written)."""
    now = now or timezone.now()
    start, end = tenant_period(tenant=tenant, moment=now)
    issued = (
        Invoice.objects.filter(tenant=tenant, period_start=start)
        .exclude(status__in=[InvoiceStatus.DRAFT, InvoiceStatus.VOID])
        .first()
    )
    if issued is not None:
        return InvoiceEstimate(start, end, issued.currency, issued.total_minor, now, issued)
    with invoicing_session():
        inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
        content = draft_compose(tenant=tenant, start=start, end=end, inputs=inputs)
    total = content.total_minor if content is not None else 0
    return InvoiceEstimate(start, end, tenant.billing_currency, total, now)


def lines_write(invoice: Invoice, lines: list[LineDraft], first: int = 1) -> None:
    InvoiceLine.objects.bulk_create(
        InvoiceLine(invoice=invoice, position=n, **line.as_fields())
        for n, line in enumerate(lines, start=first)
    )
