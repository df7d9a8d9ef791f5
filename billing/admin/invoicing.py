"""Issuers, and invoices, credit notes and invoice runs as read-only
records."""

from __future__ import annotations

from django.contrib import admin

from billing.admin.common import ReadOnlyAdmin
from billing.models import (
    CreditNote,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    Issuer,
)


@admin.register(Issuer)
class IssuerAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "country",
        "tax_id",
        "is_default",
        "invoice_prefix",
        "next_invoice_number",
    ]
    readonly_fields = ["next_invoice_number", "next_credit_note_number"]


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = ["position", "kind", "description", "quantity", "unit_price", "amount", "amount_minor"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    """Invoices change only through the invoice services (finalize, status,
    credit notes: the finance API); the database refuses edits of a
    finalized one anyway."""

    list_display = ["__str__", "tenant", "period_start", "status", "total_minor", "stripe_sync"]
    list_filter = ["status", "stripe_sync"]
    search_fields = ["number", "tenant__name", "tenant__slug"]
    inlines = [InvoiceLineInline]

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(CreditNote)
class CreditNoteAdmin(ReadOnlyAdmin):
    list_display = ["number", "invoice", "amount_minor", "reason", "created_at"]

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(InvoiceRun)
class InvoiceRunAdmin(ReadOnlyAdmin):
    list_display = ["pk", "as_of", "status", "tenants_done", "tenants_total", "invoices_created"]
