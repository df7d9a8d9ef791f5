"""Invoices: build a tenant's draft for a period, finalize it (a gapless
number, prepaid credit applied, immutable from then on), move it on to
paid, void or uncollectible.

Locks are always taken in one order: the tenant, the invoice, the
tenant's credit grants, the issuer last (held for the shortest time, as
every finalization in the issuer's sequence waits for it)."""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.choices import INVOICE_TRANSITIONS, InvoiceStatus, StripeSync
from billing.credits import credits_plan, wallet_balances
from billing.errors import InvoiceStateError
from billing.invoice_lines import LineDraft, credit_line, lines_from_charges
from billing.late_usage import late_usage_lines, usage_fingerprint
from billing.models import CreditApplication, Invoice, InvoiceLine, InvoiceRun, Issuer
from billing.periods import subscription_at
from billing.rating import charges_rate
from billing.stripe_sync import sync_enqueue
from tenants.models import Tenant

TIMESTAMP_OF = {
    InvoiceStatus.PAID: "paid_at",
    InvoiceStatus.VOID: "voided_at",
    InvoiceStatus.UNCOLLECTIBLE: "uncollectible_at",
}


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
        currency = tenant.billing_currency
        warnings: list[str] = []
        charges = charges_rate(tenant=tenant, start=period_start, end=period_end, warnings=warnings)
        lines = lines_from_charges(charges, currency=currency, start=period_start, end=period_end)
        late, fingerprints = late_usage_lines(
            tenant=tenant, before=period_start, currency=currency, building=invoice
        )
        lines += late
        if not lines:
            if invoice is not None:
                invoice.delete()
            return None, "empty"
        outcome = "rebuilt" if invoice is not None else "created"
        if invoice is None:
            invoice = Invoice(tenant=tenant, period_start=period_start, period_end=period_end)
        else:
            invoice.lines.all().delete()
        subscription = subscription_at(tenant=tenant, moment=period_start)
        invoice.issuer = (subscription and subscription.issuer) or issuer_default()
        invoice.run = run
        invoice.currency = currency
        invoice.period_end = period_end
        invoice.rated_at = timezone.now()
        invoice.usage_fingerprint = {
            period_start.isoformat(): usage_fingerprint(
                tenant=tenant, start=period_start, end=period_end
            ),
            **fingerprints,
        }
        invoice.warnings = warnings
        invoice.total_minor = sum(line.amount_minor for line in lines)
        invoice.save()
        _lines_write(invoice, lines)
        return invoice, outcome


def issuer_default() -> Issuer:
    """The default issuer (created by a migration; again here if removed)."""
    issuer, _ = Issuer.objects.get_or_create(
        is_default=True, defaults={"name": "GPU Ledger Platform"}
    )
    return issuer


def invoice_finalize(*, invoice_id: int, now: datetime | None = None) -> Invoice:
    """Draft → finalized: apply prepaid credit, take the issuer's next
    number, fix the due date. From here the invoice never changes."""
    now = now or timezone.now()
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().select_related("tenant").get(pk=invoice_id)
        if invoice.status != InvoiceStatus.DRAFT:
            raise InvoiceStateError(f"invoice {invoice} is {invoice.status}, not a draft")
        balances = wallet_balances(tenant=invoice.tenant, lock=True)
        credits = []
        for grant, minor in credits_plan(
            invoice=invoice, balances=balances, due_minor=invoice.total_minor
        ):
            CreditApplication.objects.create(grant=grant, invoice=invoice, amount_minor=minor)
            credits.append(
                credit_line(
                    grant=grant,
                    minor=minor,
                    currency=invoice.currency,
                    start=invoice.period_start,
                    end=invoice.period_end,
                )
            )
            invoice.total_minor -= minor
        _lines_write(invoice, credits, first=invoice.lines.count() + 1)
        issuer = Issuer.objects.select_for_update().get(pk=invoice.issuer_id)
        invoice.sequence = issuer.next_invoice_number
        invoice.number = f"{issuer.invoice_prefix}-{invoice.sequence:06d}"
        issuer.next_invoice_number += 1
        issuer.save(update_fields=["next_invoice_number"])
        invoice.status = InvoiceStatus.FINALIZED
        invoice.finalized_at = now
        invoice.due_at = now + timedelta(days=settings.BILLING["NET_DAYS"])
        invoice.stripe_sync = (
            StripeSync.PENDING if settings.STRIPE_API_KEY else StripeSync.NOT_SYNCED
        )
        if invoice.total_minor == 0:  # covered by credit: nothing to collect
            invoice.status = InvoiceStatus.PAID
            invoice.paid_at = now
        invoice.save()
        if invoice.stripe_sync == StripeSync.PENDING:
            sync_enqueue(invoice.pk)
    return invoice


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
    paid, void or uncollectible."""
    if invoice.status != InvoiceStatus.FINALIZED:
        return 0
    credited = sum(note.amount_minor for note in invoice.credit_notes.all())
    return max(invoice.total_minor - credited, 0)


def _lines_write(invoice: Invoice, lines: list[LineDraft], first: int = 1) -> None:
    InvoiceLine.objects.bulk_create(
        InvoiceLine(invoice=invoice, position=n, **asdict(line))
        for n, line in enumerate(lines, start=first)
    )
