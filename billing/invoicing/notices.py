"""What billing tells of invoices (webhooks.event_emit): finalized, paid,
payment failing. Each is emitted in the transaction that made it so, once
(its key)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from billing.choices import InvoiceStatus
from billing.models import Invoice
from billing.money import from_minor, money_format
from tenants.models import Tenant
from webhooks.choices import EventType
from webhooks.services import EventDraft, events_emit


def _invoice_data(invoice: Invoice) -> dict:
    return {
        "invoice_id": invoice.pk,
        "number": invoice.number,
        "status": invoice.status,
        "currency": invoice.currency,
        "total": str(from_minor(invoice.total_minor, invoice.currency)),
        "total_minor": invoice.total_minor,
        "subtotal_minor": invoice.subtotal_minor,
        "tax_minor": invoice.tax_minor,
        "period_start": invoice.period_start.isoformat(),
        "period_end": invoice.period_end.isoformat(),
        "due_at": invoice.due_at.isoformat() if invoice.due_at else None,
    }


def _invoice_event(invoice: Invoice, type: EventType, *, tenant: Tenant) -> EventDraft:
    total = money_format(invoice.total_minor, invoice.currency)
    what = {
        EventType.INVOICE_FINALIZED: f"invoice {invoice.number} issued for {total}",
        EventType.INVOICE_PAID: f"invoice {invoice.number} paid ({total})",
        EventType.INVOICE_PAYMENT_FAILED: f"payment of invoice {invoice.number} ({total}) failed",
    }[type]
    key = f"{type}:{invoice.pk}"
    if type == EventType.INVOICE_PAYMENT_FAILED:  # each failed attempt is news
        key += f":{invoice.payment_failed_at.isoformat()}"
    return EventDraft(type, tenant, key, f"{tenant.name}: {what}", _invoice_data(invoice))


def invoice_event_emit(invoice: Invoice, type: EventType) -> None:
    events_emit([_invoice_event(invoice, type, tenant=invoice.tenant)])


def invoices_moved_emit(moves: Mapping[str, Iterable[Invoice]]) -> None:
    """Drafts just finalized (a zero invoice moves straight on to paid)."""
    tenants: dict[int, Tenant] = {}
    drafts = []
    for status, invoices in moves.items():
        for invoice in invoices:
            tenant = tenants.setdefault(invoice.tenant_id, invoice.tenant)
            drafts.append(_invoice_event(invoice, EventType.INVOICE_FINALIZED, tenant=tenant))
            if status == InvoiceStatus.PAID:
                drafts.append(_invoice_event(invoice, EventType.INVOICE_PAID, tenant=tenant))
    events_emit(drafts)
