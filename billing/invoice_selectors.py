"""Reads of invoices. Every tenant-facing read takes the tenant
(invariant 5); finance staff pass tenant=None to see every tenant."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.choices import InvoiceStatus
from billing.models import Invoice, InvoiceRun
from tenants.models import Tenant


def invoice_list(*, tenant: Tenant | None, status: str | None = None) -> QuerySet[Invoice]:
    invoices = Invoice.objects.select_related("tenant", "issuer").prefetch_related("credit_notes")
    if tenant is not None:
        # A tenant sees what was issued to it, not drafts still being worked on.
        invoices = invoices.filter(tenant=tenant).exclude(status=InvoiceStatus.DRAFT)
    if status:
        invoices = invoices.filter(status=status)
    return invoices.order_by("-period_start", "tenant__name")


def invoice_get(*, tenant: Tenant | None, pk: int) -> Invoice:
    """One invoice with its lines; Invoice.DoesNotExist when the caller may
    not see it (another tenant's is simply not found)."""
    return (
        invoice_list(tenant=tenant)
        .prefetch_related("lines", "credit_notes", "credit_applications")
        .get(pk=pk)
    )


def invoice_run_list() -> QuerySet[InvoiceRun]:
    return InvoiceRun.objects.order_by("-created_at")
