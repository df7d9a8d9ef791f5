"""Invoices: the one path by which a tenant's invoice for a period is
built and finalized, for one tenant (`invoice_draft_build`,
`invoice_bill_period`) and for a chunk of an invoice run's tenants
(billing.invoicing.batch) alike: `invoices_bill` rates them (with SLA
credits for missed service levels: billing.invoicing.sla_credits), writes each
as a draft (a draft already there is rebuilt in place and keeps its row)
and, when asked, finalizes it (billing.invoicing.finalizing: prepaid
credit applied, a gapless number from the issuer, immutable from then
on). `invoice_finalize` finalizes a draft as it stands, the same way.
Then an invoice moves on to paid, void or uncollectible.

Locks are always taken in one order: the tenants (by id), their
invoices, their credit grants, the issuers last (by id; held for the
shortest time, as every finalization in an issuer's sequence waits for
them)."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.choices import INVOICE_TRANSITIONS, InvoiceStatus, StripeSync
from billing.errors import BillingInputError, InvoiceStateError
from billing.invoicing.finalizing import (
    FINAL_COLUMNS,
    Draft,
    FinalizeEarly,
    drafts_finalize,
    drafts_save,
    finalize_early_check,
    finalize_early_of_run,
    issue_moment,
)
from billing.invoicing.late_usage import EarlierPeriods, earlier_periods, late_usage_lines
from billing.invoicing.lines import LineDraft, lines_from_charges
from billing.invoicing.notices import invoice_event_emit
from billing.invoicing.sla_credits import SlaReads, sla_credit_lines, sla_reads
from billing.models import (
    CreditApplication,
    CreditGrant,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    Issuer,
)
from billing.pricing.periods import tenant_period
from billing.pricing.rating import TenantInputs, charges_compute, rating_inputs, rating_session
from billing.queueing import invoice_sync_enqueue
from billing.tax.rules import TaxDecision, lines_taxed
from billing.tax.services import TaxReads, tax_decision, tax_reads
from tenants.models import Tenant
from webhooks.choices import EventType

logger = logging.getLogger(__name__)

TIMESTAMP_OF = {
    InvoiceStatus.PAID: "paid_at",
    InvoiceStatus.VOID: "voided_at",
    InvoiceStatus.UNCOLLECTIBLE: "uncollectible_at",
}

# What draft_fill sets on an invoice (all a kept draft is rebuilt with).
DRAFT_COLUMNS = [
    "issuer",
    "run",
    "currency",
    "rated_at",
    "usage_fingerprint",
    "warnings",
    "subtotal_minor",
    "tax_minor",
    "total_minor",
    "tax_treatment",
    "tax_note",
    "buyer_country",
    "buyer_tax_id",
]


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


@dataclass
class DraftContent:
    """What a tenant's invoice for a period says, before it is written."""

    lines: list[LineDraft]
    fingerprints: dict
    warnings: list[str]
    issuer_id: int
    tax: TaxDecision

    @property
    def subtotal_minor(self) -> int:
        return sum(line.amount_minor for line in self.lines)

    @property
    def tax_minor(self) -> int:
        return sum(line.tax_minor for line in self.lines)

    @property
    def total_minor(self) -> int:
        return self.subtotal_minor + self.tax_minor


def draft_compose(
    *,
    tenant: Tenant,
    start: datetime,
    end: datetime,
    inputs: TenantInputs,
    earlier: EarlierPeriods | None = None,
    sla: SlaReads | None = None,
    tax: TaxReads | None = None,
) -> DraftContent | None:
    """Rate the period, credit its missed SLOs, check earlier periods for
    late usage and tax the lines; None when there is nothing to bill.
    Shared by the one-invoice path and the run. `earlier`, `sla`, `tax`:
    what `period_reads` loaded for many tenants at once (else read here)."""
    currency = tenant.billing_currency
    warnings: list[str] = []
    used_from: dict = {}  # the usage amount of each stretch: SLOs judged per stretch
    charges = charges_compute(
        tenant=tenant, start=start, end=end, inputs=inputs, warnings=warnings, used_from=used_from
    )
    lines = lines_from_charges(charges, currency=currency, start=start, end=end)
    if sla is None:
        sla = sla_reads(tenants=[tenant], start=start, end=end, inputs={tenant.pk: inputs})
    lines += sla_credit_lines(
        tenant=tenant, charges=charges, currency=currency, start=start, end=end, reads=sla,
        used_from=used_from,
    )  # fmt: skip
    late, fingerprints = late_usage_lines(
        tenant=tenant, before=start, currency=currency, earlier=earlier
    )
    lines += late
    if not lines:
        return None
    subscription = inputs.subscription
    issuer_id = subscription.issuer_id if subscription and subscription.issuer_id else None
    issuer_id = issuer_id or issuer_default().pk
    if tax is None:
        tax = tax_reads(tenant_ids=[tenant.pk])
    decision = tax_decision(tenant_id=tenant.pk, issuer_id=issuer_id, period_end=end, reads=tax)
    if decision.warning:
        warnings.append(decision.warning)
    return DraftContent(
        lines=lines_taxed(lines, decision),
        fingerprints={start.isoformat(): inputs.fingerprint(), **fingerprints},
        warnings=warnings,
        issuer_id=issuer_id,
        tax=decision,
    )


@dataclass(frozen=True)
class PeriodReads:
    """What invoicing tenants for a period reads up front, once for all of
    them: the usage to rate, its SLO compliance and the earlier periods to
    check for late usage (of the tenants not yet invoiced), and which hold
    prepaid credit."""

    inputs: dict[int, TenantInputs]
    earlier: EarlierPeriods
    with_credit: set[int]
    sla: SlaReads
    tax: TaxReads


def period_reads(*, tenants: list[Tenant], start: datetime, end: datetime) -> PeriodReads:
    """What `invoices_bill` needs of the period for `tenants`, in a few
    queries however many tenants."""
    final = set(
        Invoice.objects.filter(tenant__in=tenants, period_start=start)
        .exclude(status__in=[InvoiceStatus.VOID, InvoiceStatus.DRAFT])
        .values_list("tenant_id", flat=True)
    )
    to_rate = [t for t in tenants if t.pk not in final]  # a re-run rates only what is left
    inputs = rating_inputs(tenants=to_rate, start=start, end=end) if to_rate else {}
    return PeriodReads(
        inputs=inputs,
        earlier=earlier_periods(tenants=to_rate, before=start),
        with_credit=set(
            CreditGrant.objects.filter(tenant__in=tenants).values_list("tenant_id", flat=True)
        ),
        sla=sla_reads(
            tenants=to_rate,
            start=start,
            end=end,
            inputs=inputs,
        ),
        tax=tax_reads(tenant_ids=[t.pk for t in to_rate]),
    )


@dataclass
class Outcome:
    """What became of a tenant's invoice for the period: created | rebuilt
    | final (already finalized, left as it is) | empty (nothing to bill) |
    failed (`error`; nothing written for it)."""

    tenant: Tenant
    outcome: str
    invoice: Invoice | None = None
    error: str = ""


def invoices_bill(
    *,
    tenants: list[Tenant],
    start: datetime,
    end: datetime,
    run: InvoiceRun | None,
    finalize: bool,
    reads: PeriodReads | None = None,
    isolate: bool = False,
) -> list[Outcome]:
    """The period's invoices of `tenants` built and (when `finalize`)
    finalized in one transaction; an outcome per tenant, in their order.
    Finalized invoices are left alone, drafts rebuilt in place, a draft
    with nothing left to bill deleted. A tenant whose rating fails is
    raised, nothing written; with `isolate` (a run's chunk) it is reported
    failed and left as it was, and the others are written. `reads`: what
    `period_reads` loaded for many tenants at once (else read here)."""
    with transaction.atomic():
        ids = sorted(t.pk for t in tenants)
        list(Tenant.objects.select_for_update().filter(pk__in=ids).order_by("pk").only("pk"))
        live = {
            i.tenant_id: i
            for i in Invoice.objects.select_for_update()
            .filter(tenant_id__in=ids, period_start=start)
            .exclude(status=InvoiceStatus.VOID)
            .order_by("pk")
        }
        if reads is None:
            open_ = [t for t in tenants if t.pk not in live or not live[t.pk].is_final]
            reads = period_reads(tenants=open_, start=start, end=end)
        outcomes: list[Outcome] = []
        drafts: list[Draft] = []
        emptied: list[int] = []
        for tenant in tenants:
            existing = live.get(tenant.pk)
            if existing is not None and existing.is_final:
                outcomes.append(Outcome(tenant, "final", existing))
                continue
            try:
                content = _tenant_compose(tenant=tenant, start=start, end=end, reads=reads)
            except Exception as exc:
                if not isolate:
                    raise
                logger.exception("rating %s failed", tenant.slug)
                outcomes.append(Outcome(tenant, "failed", error=f"{type(exc).__name__}: {exc}"))
                continue
            if content is None:
                if existing is not None:
                    emptied.append(existing.pk)
                outcomes.append(Outcome(tenant, "empty"))
                continue
            if existing is None:
                invoice = Invoice(tenant=tenant, period_start=start, period_end=end)
            else:
                invoice = existing
                invoice.tenant = tenant  # the row we hold: no query for it
            draft_fill(invoice, content, run=run)
            drafts.append(Draft(invoice, list(content.lines)))
            outcomes.append(Outcome(tenant, "rebuilt" if existing else "created", invoice))
        _drafts_clear(kept=[d.invoice.pk for d in drafts if d.invoice.pk], emptied=emptied)
        moves: dict[str, list[Invoice]] = {}
        if finalize and drafts:
            now = issue_moment(run)
            early = finalize_early_check(
                period_start=start, period_end=end, now=now, early=finalize_early_of_run(run)
            )
            moves = drafts_finalize(drafts, now=now, early=early, with_credit=reads.with_credit)
        drafts_save(drafts, moves=moves, columns=[*DRAFT_COLUMNS, *FINAL_COLUMNS])
    return outcomes


def _tenant_compose(
    *, tenant: Tenant, start: datetime, end: datetime, reads: PeriodReads
) -> DraftContent | None:
    inputs = reads.inputs.get(tenant.pk)
    if inputs is None:  # final when the reads were made, voided since: read alone
        inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
        return draft_compose(tenant=tenant, start=start, end=end, inputs=inputs)
    return draft_compose(
        tenant=tenant,
        start=start,
        end=end,
        inputs=inputs,
        earlier=reads.earlier,
        sla=reads.sla,
        tax=reads.tax,
    )


def _drafts_clear(*, kept: list[int], emptied: list[int]) -> None:
    """Drafts to rebuild lose their lines (and any credit on them); drafts
    with nothing left to bill go."""
    InvoiceLine.objects.filter(invoice_id__in=kept).delete()
    CreditApplication.objects.filter(invoice_id__in=kept).delete()
    Invoice.objects.filter(pk__in=emptied).delete()


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
    (done,) = invoices_bill(
        tenants=[tenant], start=period_start, end=period_end, run=run, finalize=False
    )
    return done.invoice, done.outcome


def invoice_bill_period(
    *, tenant: Tenant, start: datetime, end: datetime, run: InvoiceRun | None, finalize: bool
) -> tuple[str, Invoice | None]:
    """One tenant's period built and (if asked) finalized, all or nothing:
    (outcome, invoice)."""
    (done,) = invoices_bill(tenants=[tenant], start=start, end=end, run=run, finalize=finalize)
    return done.outcome, done.invoice


def draft_fill(invoice: Invoice, content: DraftContent, *, run: InvoiceRun | None) -> None:
    invoice.issuer_id = content.issuer_id
    invoice.run = run
    invoice.currency = invoice.tenant.billing_currency
    invoice.rated_at = timezone.now()
    invoice.usage_fingerprint = content.fingerprints
    invoice.warnings = content.warnings
    invoice.subtotal_minor = content.subtotal_minor
    invoice.tax_minor = content.tax_minor
    invoice.total_minor = content.total_minor
    decision = content.tax
    invoice.tax_treatment = decision.treatment
    invoice.tax_note = decision.note
    invoice.buyer_country = decision.buyer.country if decision.buyer else ""
    invoice.buyer_tax_id = decision.buyer.tax_id if decision.buyer else ""


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


def invoice_finalize(
    *, invoice_id: int, now: datetime | None = None, early: FinalizeEarly | None = None
) -> Invoice:
    """Draft → finalized: apply prepaid credit, take the issuer's next
    number, fix the due date. From here the invoice never changes. A
    period that has not ended needs `early` (else InvoicePeriodOpenError,
    before anything is written or numbered)."""
    now = now or timezone.now()
    with transaction.atomic():
        # The invoice's row only (not its tenant's): the lock order is kept.
        invoice = (
            Invoice.objects.select_for_update(of=("self",))
            .select_related("tenant")
            .get(pk=invoice_id)
        )
        if invoice.status != InvoiceStatus.DRAFT:
            raise InvoiceStateError(f"invoice {invoice} is {invoice.status}, not a draft")
        early = finalize_early_check(
            period_start=invoice.period_start, period_end=invoice.period_end, now=now, early=early
        )
        draft = Draft(invoice, lines=[], first=invoice.lines.count() + 1)
        moves = drafts_finalize([draft], now=now, early=early, with_credit={invoice.tenant_id})
        drafts_save([draft], moves=moves, columns=FINAL_COLUMNS)
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
            invoice_sync_enqueue(invoice.pk)
        invoice.save(update_fields=[*fields, "stripe_status", "stripe_sync"])
        if to == InvoiceStatus.PAID:
            invoice_event_emit(invoice, EventType.INVOICE_PAID)
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
