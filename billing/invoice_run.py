"""The invoice run: every tenant whose billing period ended by `as_of` gets
that period's invoice, built and (unless told not to) finalized in one
transaction per tenant, so a tenant is either fully invoiced or untouched.
A run is safe to repeat and to run beside another: finalized invoices are
skipped, drafts rebuilt, and the tenant's row lock keeps two runs from
building the same invoice at once. Progress is on the run's row."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.choices import RunStatus
from billing.invoices import invoice_draft_build, invoice_finalize
from billing.models import InvoiceRun
from billing.periods import anchor_day_of, period_last_closed
from tenants.models import Tenant

logger = logging.getLogger(__name__)
Progress = Callable[[int, int], None]
PROGRESS_EVERY = 25  # tenants between progress writes


def invoice_run_create(*, as_of: datetime, finalize: bool = True, requested_by=None) -> InvoiceRun:
    return InvoiceRun.objects.create(as_of=as_of, finalize=finalize, requested_by=requested_by)


def invoice_run_execute(*, run_id: int, progress: Progress | None = None) -> InvoiceRun:
    run = InvoiceRun.objects.get(pk=run_id)
    # Suspended tenants too: what they used before is still owed.
    tenants = list(Tenant.objects.order_by("pk"))
    InvoiceRun.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING,
        started_at=timezone.now(),
        tenants_total=len(tenants),
        tenants_done=0,
        invoices_created=0,
        invoices_skipped=0,
        failures=[],
        warnings=[],
    )
    counts = {"done": 0, "created": 0, "skipped": 0}
    failures: list[dict] = []
    warnings: list[str] = []
    for n, tenant in enumerate(tenants, start=1):
        try:
            outcome, invoice = invoice_bill(tenant=tenant, as_of=run.as_of, run=run)
        except Exception as exc:  # one tenant's failure leaves the others invoiced
            logger.exception("invoice run %s: tenant %s failed", run.pk, tenant.slug)
            failures.append({"tenant": tenant.slug, "error": f"{type(exc).__name__}: {exc}"})
        else:
            counts["created" if outcome in ("created", "rebuilt") else "skipped"] += 1
            if invoice is not None and outcome != "final":
                warnings += [f"{tenant.slug}: {w}" for w in invoice.warnings]
        counts["done"] = n
        if n % PROGRESS_EVERY == 0 or n == len(tenants):
            _progress_save(run, counts, failures, warnings)
            if progress:
                progress(n, len(tenants))
    InvoiceRun.objects.filter(pk=run.pk).update(
        status=RunStatus.FAILED if failures else RunStatus.DONE, finished_at=timezone.now()
    )
    run.refresh_from_db()
    return run


def invoice_bill(*, tenant: Tenant, as_of: datetime, run: InvoiceRun | None = None):
    """One tenant's last closed period, built and finalized all or nothing:
    (outcome, invoice)."""
    start, end = period_last_closed(
        anchor_day=anchor_day_of(tenant=tenant, moment=as_of), as_of=as_of
    )
    with transaction.atomic():
        invoice, outcome = invoice_draft_build(
            tenant=tenant, period_start=start, period_end=end, run=run
        )
        if invoice is not None and outcome != "final" and (run is None or run.finalize):
            invoice = invoice_finalize(invoice_id=invoice.pk)
    return outcome, invoice


def _progress_save(run: InvoiceRun, counts, failures, warnings) -> None:
    InvoiceRun.objects.filter(pk=run.pk).update(
        tenants_done=counts["done"],
        invoices_created=counts["created"],
        invoices_skipped=counts["skipped"],
        failures=failures,
        warnings=warnings[:200],
    )
