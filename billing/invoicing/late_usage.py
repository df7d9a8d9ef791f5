"""Late usage: records that arrive after their period was invoiced. A
closed period's invoice never changes (invariant 4); instead the next
invoice rates the earlier period again and bills the difference from what
was billed for it, line by line, as late-usage lines.

Which periods to look at: the tenant's last few finalized periods
(settings.BILLING["LATE_USAGE_PERIODS"]). Rating again is skipped when the
period's usage fingerprint (token and device-second totals) is what it was
when last billed: price books in force are never edited, so the same usage
rates the same."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db.models import F, Sum

from billing.choices import InvoiceStatus, LineKind
from billing.invoicing.lines import LineDraft, LineKey, line_difference, lines_from_charges
from billing.models import Invoice, InvoiceLine
from billing.pricing.rating import TenantInputs, charges_compute, rating_inputs
from tenants.models import Tenant

Fingerprint = dict[str, int | str]


@dataclass
class EarlierPeriods:
    """What the late-usage check reads, loaded for many tenants at once:
    their last invoiced periods, each period's usage now, and each
    period's fingerprint when it was last billed."""

    invoices: dict[int, list[Invoice]]
    inputs: dict[tuple[int, datetime], TenantInputs]
    known: dict[tuple[int, str], Fingerprint]


def earlier_periods(*, tenants: list[Tenant], before: datetime) -> EarlierPeriods:
    """For invoices of a period starting at `before`: one query for the
    earlier invoices, one rating read per distinct earlier period, one for
    the fingerprints, however many tenants."""
    invoices = earlier_invoices(tenant_ids=[t.pk for t in tenants], before=before)
    by_period: dict[tuple[datetime, datetime], list[Tenant]] = defaultdict(list)
    for tenant in tenants:
        for invoice in invoices.get(tenant.pk, []):
            by_period[(invoice.period_start, invoice.period_end)].append(tenant)
    inputs = {}
    for (start, end), group in by_period.items():
        for tenant_id, read in rating_inputs(tenants=group, start=start, end=end).items():
            inputs[(tenant_id, start)] = read
    known: dict[tuple[int, str], Fingerprint] = {}
    billed = (
        invoices_billing(tenant_ids=list(invoices), building=before)
        .order_by(F("rated_at").asc(nulls_first=True))
        .values_list("tenant_id", "usage_fingerprint")
    )
    for tenant_id, fingerprints in billed:  # the newest billing of a period wins
        for key, fingerprint in fingerprints.items():
            known[(tenant_id, key)] = fingerprint
    return EarlierPeriods(invoices=invoices, inputs=inputs, known=known)


def late_usage_lines(
    *, tenant: Tenant, before: datetime, currency: str, earlier: EarlierPeriods | None = None
) -> tuple[list[LineDraft], dict[str, Fingerprint]]:
    """Late-usage lines for the invoice being built (of a period starting at
    `before`), and the fingerprints of the periods looked at. `earlier`:
    what `earlier_periods` loaded for many tenants at once."""
    if earlier is None:
        earlier = earlier_periods(tenants=[tenant], before=before)
    lines: list[LineDraft] = []
    fingerprints: dict[str, Fingerprint] = {}
    for invoice in earlier.invoices.get(tenant.pk, []):
        if invoice.currency != currency:
            continue
        start, end = invoice.period_start, invoice.period_end
        inputs = earlier.inputs[(tenant.pk, start)]
        now = inputs.fingerprint()
        if now == earlier.known.get((tenant.pk, start.isoformat())):
            continue
        fingerprints[start.isoformat()] = now
        charges = charges_compute(tenant=tenant, start=start, end=end, inputs=inputs)
        rated = {
            line.key: line
            for line in lines_from_charges(charges, currency=currency, start=start, end=end)
        }
        others = invoices_billing(tenant_ids=[tenant.pk], building=before)
        billed = period_billed(others, start=start, end=end)
        for key in sorted(rated.keys() | billed.keys(), key=_sortable):
            line = line_difference(rated=rated.get(key), billed=billed.get(key))
            if line is not None:
                lines.append(line)
    return lines, fingerprints


def invoices_billing(*, tenant_ids: list[int], building: datetime):
    """The tenants' invoices that count as billed: not void, and not the
    one being built now (the period starting at `building`)."""
    return (
        Invoice.objects.filter(tenant_id__in=tenant_ids)
        .exclude(status=InvoiceStatus.VOID)
        .exclude(period_start=building)
    )


def earlier_invoices(*, tenant_ids: list[int], before: datetime) -> dict[int, list[Invoice]]:
    """Per tenant, its last few finalized invoices of periods ended by
    `before` (one query for every tenant)."""
    out: dict[int, list[Invoice]] = {}
    invoices = (
        Invoice.objects.filter(tenant_id__in=tenant_ids, period_end__lte=before)
        .exclude(status__in=[InvoiceStatus.VOID, InvoiceStatus.DRAFT])
        .only("pk", "tenant_id", "period_start", "period_end", "currency")
        .order_by("tenant_id", "-period_start")
    )
    for invoice in invoices:
        kept = out.setdefault(invoice.tenant_id, [])
        if len(kept) < settings.BILLING["LATE_USAGE_PERIODS"]:
            kept.append(invoice)
    return out


def period_billed(invoices, *, start: datetime, end: datetime) -> dict[LineKey, LineDraft]:
    """What was billed for the period, by line key: its own invoice's lines
    and every late-usage line for it since (credit applied, prepaid or an
    SLA credit, is not usage)."""
    rows = (
        InvoiceLine.objects.filter(invoice__in=invoices, service_start=start)
        .exclude(kind__in=[LineKind.CREDIT, LineKind.SLA_CREDIT])
        .values("kind", "model", "token_kind", "book", "unit_price")
        .annotate(
            quantity=Sum("quantity"),
            amount=Sum("amount"),
            amount_minor=Sum("amount_minor"),
        )
    )
    descriptions = {
        (k, m, t, b, u): d
        for k, m, t, b, u, d in InvoiceLine.objects.filter(
            invoice__in=invoices, service_start=start, late=False
        ).values_list("kind", "model", "token_kind", "book", "unit_price", "description")
    }
    out: dict[LineKey, LineDraft] = {}
    for row in rows:
        key = (row["kind"], row["model"], row["token_kind"], row["book"], row["unit_price"])
        out[key] = LineDraft(
            kind=row["kind"],
            description=descriptions.get(key, row["kind"]),
            quantity=row["quantity"],
            unit_price=row["unit_price"],
            amount=row["amount"],
            amount_minor=row["amount_minor"],
            service_start=start,
            service_end=end,
            model=row["model"],
            token_kind=row["token_kind"],
            book=row["book"],
        )
    return out


def _sortable(key: LineKey):
    kind, model, token_kind, book, unit = key
    return (kind, model, token_kind, book, unit if unit is not None else Decimal(-1))
