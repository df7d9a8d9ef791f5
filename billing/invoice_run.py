"""The invoice run: every tenant whose billing period ended by `as_of` gets
that period's invoice, built and (unless told not to) finalized; a tenant
is either fully invoiced or untouched (billing.invoice_batch).
A run is safe to repeat and to run beside another: finalized invoices are
skipped, drafts rebuilt, and the tenant's row lock keeps two runs from
building the same invoice at once. Progress is on the run's row."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

from billing.choices import RunStatus
from billing.invoice_batch import invoices_bill_many
from billing.invoices import invoice_bill_period, invoicing_session
from billing.models import InvoiceRun
from billing.periods import tenants_by_period
from tenants.models import Tenant

logger = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


def invoice_run_create(*, as_of: datetime, finalize: bool = True, requested_by=None) -> InvoiceRun:
    return InvoiceRun.objects.create(as_of=as_of, finalize=finalize, requested_by=requested_by)


def invoice_run_execute(
    *, run_id: int, progress: Progress | None = None, current_period: bool = False
) -> InvoiceRun:
    """`current_period`: the period still running at `as_of` instead of the
    last closed one (drafts so far, as the demo shows; a draft is rebuilt
    and finalized when its period has ended)."""
    report = progress
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
    with invoicing_session():
        periods = tenants_by_period(tenants=tenants, moment=run.as_of, closed=not current_period)
        for (start, end), group in periods.items():
            done_before = counts["done"]

            def progress(outcomes, done_before=done_before):
                _count(outcomes, counts, failures, warnings, done_before)
                _progress_save(run, counts, failures, warnings)
                if report:
                    report(counts["done"], len(tenants))

            invoices_bill_many(
                tenants=group,
                start=start,
                end=end,
                run=run,
                finalize=run.finalize,
                progress=progress,
            )
    InvoiceRun.objects.filter(pk=run.pk).update(
        status=RunStatus.FAILED if failures else RunStatus.DONE, finished_at=timezone.now()
    )
    run.refresh_from_db()
    return run


def _count(outcomes, counts, failures, warnings, done_before) -> None:
    """Running totals from a period group's outcomes so far."""
    fresh = outcomes[counts["done"] - done_before :]
    for o in fresh:
        if o.outcome == "failed":
            failures.append({"tenant": o.tenant.slug, "error": o.error})
        elif o.outcome in ("created", "rebuilt"):
            counts["created"] += 1
            warnings += [f"{o.tenant.slug}: {w}" for w in o.invoice.warnings]
        else:
            counts["skipped"] += 1
    counts["done"] += len(fresh)


def invoice_bill(*, tenant: Tenant, as_of: datetime, run: InvoiceRun | None = None):
    """One tenant's last closed period, built and finalized all or nothing:
    (outcome, invoice)."""
    ((start, end),) = tenants_by_period(tenants=[tenant], moment=as_of, closed=True)
    return invoice_bill_period(
        tenant=tenant, start=start, end=end, run=run, finalize=run is None or run.finalize
    )


def _progress_save(run: InvoiceRun, counts, failures, warnings) -> None:
    InvoiceRun.objects.filter(pk=run.pk).update(
        tenants_done=counts["done"],
        invoices_created=counts["created"],
        invoices_skipped=counts["skipped"],
        failures=failures,
        warnings=warnings[:200],
    )
