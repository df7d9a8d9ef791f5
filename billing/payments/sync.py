"""Our invoices in Stripe. A finalized invoice is pushed as a Stripe
invoice with one item per line (described as the invoice page reads it:
quantity, unit price, tier; billing.invoicing.lines.line_text), finalized
there; later states (paid out of band, void, uncollectible) and credit
notes follow. A line's tax goes as a Stripe tax rate (created from ours
when first used): Stripe computes each line's tax itself, and the invoice
is finalized there only when Stripe's total is ours to the cent. Each step saves
the Stripe id it learned at once and is keyed for idempotency, so a sync
that dies anywhere is finished by the next one with nothing doubled.

A sync that fails on a transient error (Stripe down, slow, rate limited)
leaves the invoice "failed" with the error; the task retries with backoff
and a sweep every few minutes picks up whatever is still pending."""

from __future__ import annotations

import logging

from django.db.models import Q

from billing.choices import InvoiceStatus, StripeSync
from billing.invoicing.lines import line_text
from billing.models import CreditNote, Invoice, TaxRate
from billing.payments import stripe_api
from billing.payments.customers import stripe_customer_get_or_create
from core.locks import advisory_lock_try

logger = logging.getLogger(__name__)
LOCK_NAMESPACE = 7_202_611  # pg advisory lock (namespace, invoice id)

# Our state -> the Stripe call that brings an open Stripe invoice there.
PUSH_STATE = {
    InvoiceStatus.PAID: ("paid", stripe_api.invoice_pay_out_of_band),
    InvoiceStatus.VOID: ("void", stripe_api.invoice_void),
    InvoiceStatus.UNCOLLECTIBLE: ("uncollectible", stripe_api.invoice_mark_uncollectible),
}


def invoice_stripe_sync(*, invoice_id: int) -> str:
    """Bring the invoice (and its credit notes) to the same state in
    Stripe. Returns the resulting sync status."""
    if not stripe_api.configured():
        return StripeSync.NOT_SYNCED
    with advisory_lock_try((LOCK_NAMESPACE, invoice_id)) as locked:
        if not locked:
            return "busy"  # another worker is syncing it now
        invoice = Invoice.objects.select_related("tenant").get(pk=invoice_id)
        if invoice.status == InvoiceStatus.DRAFT:
            return invoice.stripe_sync
        try:
            _push(invoice)
        except stripe_api.TRANSIENT_ERRORS as exc:
            _save(invoice, stripe_sync=StripeSync.FAILED, stripe_error=str(exc)[:2000])
            raise
        except Exception as exc:
            _save(invoice, stripe_sync=StripeSync.FAILED, stripe_error=str(exc)[:2000])
            logger.exception("Stripe sync of invoice %s failed", invoice_id)
            raise
        _save(invoice, stripe_sync=StripeSync.SYNCED, stripe_error="")
        return StripeSync.SYNCED


def invoices_awaiting_sync() -> list[int]:
    """Finalized invoices not yet in step with Stripe (for the sweep)."""
    if not stripe_api.configured():
        return []
    pending_notes = CreditNote.objects.filter(stripe_credit_note_id="").values("invoice_id")
    return list(
        Invoice.objects.exclude(status=InvoiceStatus.DRAFT)
        .filter(
            Q(stripe_sync__in=[StripeSync.PENDING, StripeSync.FAILED])
            | Q(pk__in=pending_notes, stripe_invoice_id__gt="")
        )
        .order_by("pk")
        .values_list("pk", flat=True)[:500]
    )


class StripeTotalMismatch(Exception):
    """Stripe's total for the invoice is not ours: it is left a draft there."""


def _push(invoice: Invoice) -> None:
    customer = stripe_customer_get_or_create(tenant=invoice.tenant)
    if not invoice.stripe_invoice_id:
        stripe_id = stripe_api.invoice_create(
            invoice_id=invoice.pk,
            number=invoice.number,
            customer=customer,
            currency=invoice.currency,
            days_until_due=max((invoice.due_at - invoice.finalized_at).days, 0),
            footer=invoice.tax_note,
        )
        _save(invoice, stripe_invoice_id=stripe_id, stripe_status="draft")
    if invoice.stripe_status in ("", "draft"):
        present = stripe_api.invoice_item_ids(stripe_invoice_id=invoice.stripe_invoice_id)
        rates = _stripe_tax_rates(invoice)
        for line in invoice.lines.order_by("position"):
            if line.pk in present or line.amount_minor == 0:
                continue
            stripe_api.invoice_item_create(
                invoice_id=invoice.pk,
                customer=customer,
                stripe_invoice_id=invoice.stripe_invoice_id,
                currency=invoice.currency,
                item=stripe_api.ItemSpec(
                    line_id=line.pk,
                    amount_minor=line.amount_minor,
                    description=line_text(line, currency=invoice.currency),
                    period_start=int(line.service_start.timestamp()),
                    period_end=int(line.service_end.timestamp()),
                    tax_rates=(rates[line.tax_rate_id],) if line.tax_rate_id else (),
                ),
            )
        # Stripe computes each line's tax from the rate; issued there only
        # when its total is ours to the cent.
        ours = invoice.total_minor
        theirs = stripe_api.invoice_total(stripe_invoice_id=invoice.stripe_invoice_id)
        if theirs != ours:
            raise StripeTotalMismatch(
                f"Stripe's total for {invoice.number} is {theirs}, ours {ours} (minor units): "
                "left a draft in Stripe"
            )
        finalized = stripe_api.invoice_finalize(
            invoice_id=invoice.pk, stripe_invoice_id=invoice.stripe_invoice_id
        )
        _save(
            invoice, stripe_status=finalized.status, hosted_invoice_url=finalized.hosted_invoice_url
        )
    # Notes issued while the invoice was unpaid reduce what Stripe asks for
    # (all of it: Stripe then marks it paid itself), so they go before the
    # invoice's own move; notes on a paid invoice (their amount back in our
    # wallet) after it, settled out of band.
    notes = list(invoice.credit_notes.filter(stripe_credit_note_id="").order_by("pk"))
    before = [n for n in notes if n.wallet_grant_id is None]
    _credit_notes_push(invoice, before)
    if before:
        _save(invoice, stripe_status=stripe_api.invoice_status(invoice.stripe_invoice_id))
    target = PUSH_STATE.get(InvoiceStatus(invoice.status))
    if target and invoice.stripe_status == "open":
        stripe_status, call = target
        call(invoice_id=invoice.pk, stripe_invoice_id=invoice.stripe_invoice_id)
        _save(invoice, stripe_status=stripe_status)
    _credit_notes_push(invoice, [n for n in notes if n.wallet_grant_id is not None])


def _credit_notes_push(invoice: Invoice, notes: list[CreditNote]) -> None:
    for note in notes:
        note_id = stripe_api.credit_note_create(
            credit_note_id=note.pk,
            stripe_invoice_id=invoice.stripe_invoice_id,
            amount_minor=note.amount_minor,
            memo=f"{note.number}: {note.reason}",
            paid=note.wallet_grant_id is not None,
            tax=_credit_note_tax(invoice, note),
        )
        CreditNote.objects.filter(pk=note.pk).update(stripe_credit_note_id=note_id)


def _credit_note_tax(invoice: Invoice, note: CreditNote) -> tuple[str, int] | None:
    """The tax `note` reverses, at the invoice's Stripe tax rate: an
    invoice is taxed at one rate (its buyer's, on its period's last day)."""
    if not note.tax_minor:
        return None
    rate_ids = set(invoice.lines.filter(tax_minor__gt=0).values_list("tax_rate_id", flat=True))
    if len(rate_ids) != 1:
        raise ValueError(
            f"{invoice.number} is taxed at {len(rate_ids)} rates: its credit note "
            f"{note.number} cannot carry its tax to Stripe"
        )
    return _stripe_tax_rates(invoice)[rate_ids.pop()], note.tax_minor


def _stripe_tax_rates(invoice: Invoice) -> dict[int, str]:
    """Our rate id -> its Stripe tax rate, for the rates the invoice's lines
    carry; created in Stripe the first time one is used (keyed by our id)."""
    ids = set(invoice.lines.exclude(tax_rate=None).values_list("tax_rate_id", flat=True))
    out = {}
    for rate in TaxRate.objects.filter(pk__in=ids):
        if not rate.stripe_tax_rate_id:
            rate.stripe_tax_rate_id = stripe_api.tax_rate_create(
                rate_id=rate.pk,
                display_name=rate.name,
                percentage=rate.percent,
                country=rate.country,
            )
            TaxRate.objects.filter(pk=rate.pk).update(stripe_tax_rate_id=rate.stripe_tax_rate_id)
        out[rate.pk] = rate.stripe_tax_rate_id
    return out


def _save(invoice: Invoice, **fields) -> None:
    """Stripe bookkeeping only (the finalized invoice's own content is immutable)."""
    for name, value in fields.items():
        setattr(invoice, name, value)
    Invoice.objects.filter(pk=invoice.pk).update(**fields)
