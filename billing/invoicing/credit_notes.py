"""Credit notes: the only way to correct a finalized invoice. A note on an
open invoice reduces what is due (when nothing is left due, the invoice is
paid); a note on a paid invoice returns the amount to the tenant's credit
wallet as a new grant. Numbered per issuer without gaps, like invoices.
A note's amount includes tax: it reverses its share of the invoice's
(billing.tax.rules.credit_note_tax_minor)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.errors import BillingInputError, InvoiceStateError
from billing.models import CreditGrant, CreditNote, Invoice, Issuer
from billing.money import from_minor
from billing.queueing import invoice_sync_enqueue
from billing.tax.rules import credit_note_tax_minor

REASON_MAX = CreditNote._meta.get_field("reason").max_length


def credit_note_create(
    *, invoice_id: int, amount_minor: int, reason: str, created_by=None
) -> CreditNote:
    """A credit note of `amount_minor` on a finalized (or paid, or
    uncollectible) invoice, with a reason of at most REASON_MAX characters;
    bad input is a BillingInputError naming the field, before anything is
    written. The invoice page and the API both come through here."""
    if not isinstance(amount_minor, int) or amount_minor <= 0:
        raise BillingInputError("amount_minor", "must be a positive whole number of minor units")
    reason = (reason or "").strip()
    if not reason:
        raise BillingInputError("reason", "a credit note needs a reason")
    if len(reason) > REASON_MAX:
        raise BillingInputError("reason", f"at most {REASON_MAX} characters")
    with transaction.atomic():
        invoice = Invoice.objects.select_for_update().get(pk=invoice_id)
        if invoice.status not in (
            InvoiceStatus.FINALIZED,
            InvoiceStatus.PAID,
            InvoiceStatus.UNCOLLECTIBLE,
        ):
            raise InvoiceStateError(f"invoice {invoice} is {invoice.status}: nothing to credit")
        before = invoice.credit_notes.aggregate(s=Sum("amount_minor"), t=Sum("tax_minor"))
        credited, reversed_tax = before["s"] or 0, before["t"] or 0
        if credited + amount_minor > invoice.total_minor:
            raise BillingInputError(
                "amount_minor",
                f"at most {invoice.total_minor - credited} minor units are left to credit "
                f"on {invoice.number}",
            )
        grant = None
        now = timezone.now()
        if invoice.status == InvoiceStatus.PAID:
            grant = CreditGrant.objects.create(
                tenant_id=invoice.tenant_id,
                amount=from_minor(amount_minor, invoice.currency),
                currency=invoice.currency,
                granted_at=now,
                note=f"credit note on {invoice.number}",
            )
        issuer = Issuer.objects.select_for_update().get(pk=invoice.issuer_id)
        sequence = issuer.next_credit_note_number
        issuer.next_credit_note_number += 1
        issuer.save(update_fields=["next_credit_note_number"])
        note = CreditNote.objects.create(
            invoice=invoice,
            issuer=issuer,
            sequence=sequence,
            number=f"{issuer.credit_note_prefix}-{sequence:06d}",
            reason=reason,
            amount_minor=amount_minor,
            tax_minor=credit_note_tax_minor(
                gross_minor=invoice.subtotal_minor + invoice.tax_minor,
                tax_minor=invoice.tax_minor,
                credited_before=credited,
                reversed_before=reversed_tax,
                amount=amount_minor,
            ),
            wallet_grant=grant,
            created_by=created_by,
        )
        if (
            invoice.status == InvoiceStatus.FINALIZED
            and credited + amount_minor == invoice.total_minor
        ):
            invoice.status = InvoiceStatus.PAID
            invoice.paid_at = now
            invoice.save(update_fields=["status", "paid_at"])
        if invoice.stripe_invoice_id:
            invoice_sync_enqueue(invoice.pk)
    return note
