"""Stripe's webhook events: verified, stored by event id before anything
else, handled once. Delivery order is not trusted: an invoice only moves
forward (paid and void are final), so a late, stale event changes nothing
and is recorded as such. Types we do not handle are stored and answered
200, as Stripe expects."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.utils import timezone

from billing.choices import INVOICE_TRANSITIONS, InvoiceStatus
from billing.invoicing.invoices import invoice_transition
from billing.invoicing.notices import invoice_event_emit
from billing.models import Invoice, StripeEvent
from billing.payments import stripe_api
from billing.payments.customers import stripe_customer_unlink
from webhooks.choices import EventType

logger = logging.getLogger(__name__)

INVOICE_STATE_EVENTS = {
    "invoice.paid": InvoiceStatus.PAID,
    "invoice.voided": InvoiceStatus.VOID,
    "invoice.marked_uncollectible": InvoiceStatus.UNCOLLECTIBLE,
}


class BadSignature(Exception):
    """Forged, missing or stale signature (400, nothing stored)."""


def stripe_event_receive(*, payload: bytes, signature: str) -> StripeEvent:
    try:
        event = stripe_api.webhook_event(payload=payload, signature=signature)
    except (stripe_api.SignatureError, ValueError) as exc:
        raise BadSignature(str(exc)) from None
    with transaction.atomic():
        row, _ = StripeEvent.objects.get_or_create(
            event_id=event["id"],
            defaults={
                "type": event.get("type", ""),
                "created": datetime.fromtimestamp(event.get("created", 0), tz=UTC),
                "payload": event,
            },
        )
        row = StripeEvent.objects.select_for_update().get(pk=row.pk)
        if row.processed_at is not None:
            return row  # a redelivery: handled already
        row.outcome = _handle(row.type, event, row.created)
        row.processed_at = timezone.now()
        row.save(update_fields=["outcome", "processed_at"])
    return row


def _handle(kind: str, event: dict[str, Any], created: datetime) -> str:
    obj = event.get("data", {}).get("object", {})
    if kind in INVOICE_STATE_EVENTS or kind == "invoice.payment_failed":
        invoice = _our_invoice(obj)
        if invoice is None:
            return f"no invoice of ours for {obj.get('id')}"
        if kind == "invoice.payment_failed":
            Invoice.objects.filter(pk=invoice.pk).update(payment_failed_at=created)
            invoice.payment_failed_at = created
            invoice_event_emit(invoice, EventType.INVOICE_PAYMENT_FAILED)
            return f"payment failed on {invoice.number}"
        to = INVOICE_STATE_EVENTS[kind]
        if invoice.status == to:
            return f"{invoice.number} already {to}"
        if to not in INVOICE_TRANSITIONS[InvoiceStatus(invoice.status)]:
            return f"stale: {invoice.number} is {invoice.status}, not moved to {to}"
        invoice_transition(invoice_id=invoice.pk, to=to, at=created, from_stripe=True)
        return f"{invoice.number} -> {to}"
    if kind == "customer.deleted":
        unlinked = stripe_customer_unlink(stripe_customer_id=obj.get("id") or "")
        return f"customer unlinked from {unlinked} tenant(s)"
    return "ignored: type not handled"


def _our_invoice(obj: dict[str, Any]) -> Invoice | None:
    """By the Stripe id we saved, or by our id in its metadata (an event can
    arrive before we saved the Stripe id)."""
    invoice = Invoice.objects.filter(stripe_invoice_id=obj.get("id") or "-").first()
    if invoice is None:
        ours = (obj.get("metadata") or {}).get("ledger_invoice_id")
        if ours and str(ours).isdigit():
            invoice = Invoice.objects.filter(pk=int(ours)).first()
    return invoice
