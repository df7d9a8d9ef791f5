"""Billing's follow-up work after a commit (core.queueing): the Stripe
sync of an invoice, which the Stripe sweep picks up when the broker
refuses it."""

from __future__ import annotations

from django.conf import settings

from billing.choices import StripeSync
from billing.models import Invoice
from core.queueing import task_send

INVOICE_STRIPE_SYNC_TASK = "billing.invoice_stripe_sync"  # its name in billing.tasks


def invoice_sync_enqueue(invoice_id: int) -> None:
    """After the current transaction commits, hand the invoice to a Stripe
    sync worker. The caller has marked it pending in that transaction, so
    if the broker refuses, the sweep (billing.stripe_sweep) queues it
    later; the reason is kept in stripe_error meanwhile."""
    if not settings.STRIPE_API_KEY:
        return
    task_send(
        INVOICE_STRIPE_SYNC_TASK,
        invoice_id,
        what=f"Stripe sync of invoice {invoice_id} (the Stripe sweep will retry)",
        on_refused=lambda reason: Invoice.objects.filter(
            pk=invoice_id, stripe_sync=StripeSync.PENDING
        ).update(stripe_error=reason),
    )
