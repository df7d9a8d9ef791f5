"""History reproduces (invariant 9): re-rating any closed period gives, to
the cent, what was billed for it: its finalized invoice's lines plus any
late-usage lines billed for it since (billing.invoicing.late_usage). Price
versions in force are never edited (billing.pricing.catalog), and rating
prices each hour under the tier, book and plan in force then, so the same
usage rates the same.

A period whose usage changed since it was last billed (late usage, to be
billed on the next invoice) is counted as pending, not as a difference.
SLA credits and prepaid credit are not usage and are not compared.
A standing check (a beat job, a line on the finance overview); expected:
no difference, each one logged as an error."""

from __future__ import annotations

import logging
from collections import defaultdict
from datetime import datetime, timedelta

from django.db.models import F
from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.invoicing.late_usage import invoices_billing, period_billed
from billing.invoicing.lines import lines_from_charges
from billing.models import Invoice, ReproductionCheck
from billing.pricing.rating import charges_compute, rating_inputs, rating_session

logger = logging.getLogger(__name__)

HORIZON = timedelta(days=400)  # the ledger's retention: 13 months


def reproduction_check(*, since: datetime | None = None) -> ReproductionCheck:
    """Re-rate every finalized invoice's period since `since` (default: the
    retention horizon) and record what differs from what was billed."""
    since = since or timezone.now() - HORIZON
    invoices = list(
        Invoice.objects.filter(period_start__gte=since)
        .exclude(status__in=[InvoiceStatus.DRAFT, InvoiceStatus.VOID])
        .select_related("tenant")
        .order_by("period_start", "tenant_id")
    )
    by_period: dict[tuple[datetime, datetime], list[Invoice]] = defaultdict(list)
    for invoice in invoices:
        by_period[(invoice.period_start, invoice.period_end)].append(invoice)
    differences: list[dict] = []
    pending = 0
    with rating_session():
        for (start, end), group in by_period.items():
            inputs = rating_inputs(tenants=[i.tenant for i in group], start=start, end=end)
            for invoice in group:
                found = _invoice_differences(invoice, inputs[invoice.tenant_id])
                if found is None:
                    pending += 1
                differences += found or []
    for difference in differences:
        logger.error("re-rating does not reproduce what was billed: %s", difference)
    return ReproductionCheck.objects.create(
        invoices=len(invoices), pending_late_usage=pending, differences=differences
    )


def _invoice_differences(invoice: Invoice, inputs) -> list[dict] | None:
    """The lines of the invoice's period whose re-rated amount differs from
    what was billed; None when late usage since is not yet billed."""
    tenant, start, end = invoice.tenant, invoice.period_start, invoice.period_end
    billing = invoices_billing(tenant_ids=[tenant.pk], building=None)
    known = None
    for fingerprints in billing.order_by(F("rated_at").asc(nulls_first=True)).values_list(
        "usage_fingerprint", flat=True
    ):
        known = fingerprints.get(start.isoformat(), known)
    if known is not None and known != inputs.fingerprint():
        return None
    charges = charges_compute(tenant=tenant, start=start, end=end, inputs=inputs)
    rated = {
        line.key: line.amount_minor
        for line in lines_from_charges(charges, currency=invoice.currency, start=start, end=end)
    }
    billed = {
        key: line.amount_minor for key, line in period_billed(billing, start=start, end=end).items()
    }
    return [
        {
            "invoice": invoice.number or str(invoice.pk),
            "tenant": tenant.slug,
            "period_start": start.isoformat(),
            "line": " / ".join(str(part) for part in key if part not in ("", None)),
            "billed_minor": billed.get(key, 0),
            "rated_minor": rated.get(key, 0),
        }
        for key in sorted(rated.keys() | billed.keys(), key=str)
        if rated.get(key, 0) != billed.get(key, 0)
    ]


def reproduction_latest() -> ReproductionCheck | None:
    """The newest run of the check, for the finance overview."""
    return ReproductionCheck.objects.order_by("-checked_at").first()
