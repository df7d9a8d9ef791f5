"""Reads of invoices. Every tenant-facing read takes the tenant
(invariant 5); finance staff pass tenant=None to see every tenant.
Open invoices (finalized, something left to pay) are what a tenant owes
and what finance's receivables ageing is made of; amounts are per
currency, never added across currencies."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    OuterRef,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce

from billing.choices import InvoiceStatus, LineKind
from billing.models import CreditNote, Invoice, InvoiceLine, InvoiceRun
from core.calendar import day_start
from tenants.models import Tenant

# Receivables by calendar days (UTC) past the due date: an invoice is
# payable through the whole of its due date, so it is overdue from the
# midnight after it (due 10-31: 1 day overdue on 11-01, 31 on 12-01).
AGE_BUCKETS = [
    ("current", "Current (not yet due)"),
    ("1-30", "1-30 days overdue"),
    ("31-60", "31-60 days overdue"),
    ("61-90", "61-90 days overdue"),
    ("90+", "Over 90 days overdue"),
]
OPEN_INVOICES_SHOWN = 200


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


def invoices_open(*, tenant: Tenant | None) -> QuerySet[Invoice]:
    """Finalized invoices with something left to pay (not paid, void or
    uncollectible; credit notes deducted), each with `due_minor`; the
    oldest due first. tenant=None: every tenant's (finance staff)."""
    credited = (
        CreditNote.objects.filter(invoice=OuterRef("pk"))
        .values("invoice")
        .annotate(minor=Sum("amount_minor"))
        .values("minor")
    )
    invoices = Invoice.objects.filter(status=InvoiceStatus.FINALIZED)
    if tenant is not None:
        invoices = invoices.filter(tenant=tenant)
    return (
        invoices.annotate(due_minor=F("total_minor") - Coalesce(Subquery(credited), 0))
        .filter(due_minor__gt=0)
        .select_related("tenant")
        .order_by("due_at", "pk")
    )


@dataclass
class Receivables:
    """Open invoices by age at `as_of`: totals[currency][bucket] in minor
    units (and totals[currency]["total"]), counts likewise; the oldest
    open invoices listed with their age."""

    as_of: datetime
    totals: dict[str, dict[str, int]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    invoices: list[Invoice] = field(default_factory=list)
    open_count: int = 0
    buckets: list[tuple[str, str]] = field(default_factory=lambda: list(AGE_BUCKETS))

    @property
    def rows(self) -> list[tuple[str, list[tuple[str, int]], int]]:
        """(currency, [(bucket, minor) in bucket order], total) for a table."""
        return [
            (currency, [(key, row[key]) for key, _ in self.buckets], row["total"])
            for currency, row in self.totals.items()
        ]


def _age_bucket(as_of: datetime) -> Case:
    """The bucket of days_overdue, in SQL: due on or after today's UTC
    midnight is current; due on or after the midnight N days before, at
    most N days overdue."""
    days, today = timedelta(days=1), day_start(as_of)
    return Case(
        When(due_at__gte=today, then=Value("current")),
        When(due_at__gte=today - 30 * days, then=Value("1-30")),
        When(due_at__gte=today - 60 * days, then=Value("31-60")),
        When(due_at__gte=today - 90 * days, then=Value("61-90")),
        default=Value("90+"),
        output_field=CharField(),
    )


def receivables_aging(*, as_of: datetime) -> Receivables:
    """Accounts receivable for finance staff: every tenant's open
    invoices, summed in SQL per currency and age bucket."""
    open_invoices = invoices_open(tenant=None).annotate(bucket=_age_bucket(as_of))
    out = Receivables(as_of=as_of)
    totals: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_keys(), 0))
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_keys(), 0))
    rows = (
        open_invoices.order_by()
        .values("currency", "bucket")
        .annotate(minor=Sum("due_minor"), n=Count("pk"))
        .values_list("currency", "bucket", "minor", "n")
    )
    for currency, bucket, minor, n in rows:
        for key in (bucket, "total"):
            totals[currency][key] += minor
            counts[currency][key] += n
        out.open_count += n
    out.totals = {c: totals[c] for c in sorted(totals)}
    out.counts = {c: counts[c] for c in sorted(counts)}
    out.invoices = list(open_invoices.select_related("issuer")[:OPEN_INVOICES_SHOWN])
    for invoice in out.invoices:
        invoice.days_overdue = days_overdue(due_at=invoice.due_at, as_of=as_of)
    return out


def sla_credits_by_tenant(*, start: datetime, end: datetime) -> dict[int, int]:
    """Per tenant, the SLA credits (minor units of its invoices' currency,
    positive) on its live invoices, drafts included, of billing periods
    ending in (start, end]: revenue given back for missed service levels,
    counted in the report period in which the billing period ends (every
    tenant: finance staff code paths only)."""
    rows = (
        InvoiceLine.objects.filter(
            kind=LineKind.SLA_CREDIT, invoice__period_end__gt=start, invoice__period_end__lte=end
        )
        .exclude(invoice__status=InvoiceStatus.VOID)
        .values("invoice__tenant_id")
        .annotate(minor=Sum("amount_minor"))
        .values_list("invoice__tenant_id", "minor")
    )
    return {tenant_id: -minor for tenant_id, minor in rows if minor}


def days_overdue(*, due_at: datetime, as_of: datetime) -> int:
    """Calendar days (UTC) from the due date to `as_of`'s date; 0 when due
    today or later (the due date itself is not overdue)."""
    return max(0, (day_start(as_of) - day_start(due_at)).days)


def _keys() -> list[str]:
    return [key for key, _ in AGE_BUCKETS] + ["total"]
