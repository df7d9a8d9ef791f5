"""The invoice run: every tenant whose billing period ended by `as_of` gets
that period's invoice, built and (unless told not to) finalized; a tenant
is either fully invoiced or untouched (billing.invoicing.batch).
A run is safe to repeat and to run beside another: finalized invoices are
skipped, drafts rebuilt, and the tenant's row lock keeps two runs from
building the same invoice at once. Progress is on the run's row.
An `as_of` later than now picks periods that have not ended: such a run
is refused unless it finalizes early with a reason, or builds drafts."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.errors import BillingInputError
from billing.invoicing.batch import invoices_bill_many
from billing.invoicing.finalizing import FinalizeEarly, finalize_early_check
from billing.invoicing.invoices import invoicing_session
from billing.models import InvoiceRun
from billing.pricing.periods import tenants_by_period
from billing.runs import (
    run_executing,
    run_finish,
    run_progress,
    run_start,
    runs_abandoned_fail,
)
from core.calendar import OUT_OF_RANGE, moment_supported
from tenants.models import Tenant

logger = logging.getLogger(__name__)
Progress = Callable[[int, int], None]


def invoice_run_create(
    *,
    as_of: datetime,
    finalize: bool = True,
    requested_by=None,
    early: FinalizeEarly | None = None,
    issued_at: datetime | None = None,
) -> InvoiceRun:
    """A run, checked before anything is written: `as_of` within the
    supported span (core.calendar) and the periods it picks begun (else
    BillingInputError naming as_of) and, when it finalizes, ended unless
    `early` (else InvoicePeriodOpenError naming the period's end). The
    page, the API and the command all come through here. `issued_at`: the
    issue date of what it finalizes (a backfill of past months; due
    NET_DAYS after it), never in the future; default the moment each is
    finalized."""
    if issued_at is not None and issued_at > timezone.now():
        raise BillingInputError("issued_at", "an invoice cannot be issued in the future")
    early = invoice_run_periods_check(as_of=as_of, finalize=finalize, early=early)
    return InvoiceRun.objects.create(
        as_of=as_of,
        issued_at=issued_at,
        finalize=finalize,
        requested_by=requested_by,
        finalize_early_reason=early.reason if early else "",
        finalize_early_by=early.by if early else "",
    )


def invoice_run_periods_check(
    *, as_of: datetime, finalize: bool, early: FinalizeEarly | None
) -> FinalizeEarly | None:
    """What finalizing early the run needs: None when every period it
    picks has ended (then `early` is not recorded), else `early`."""
    if not moment_supported(as_of):  # year 1 overflows the calendar in the worker
        raise BillingInputError("as_of", OUT_OF_RANGE)
    if early is not None and not finalize:
        raise BillingInputError("finalize_early", "a run that leaves drafts finalizes nothing")
    now = timezone.now()
    if as_of <= now:
        return None  # periods ended by as_of ended by now
    try:
        periods = tenants_by_period(
            tenants=list(Tenant.objects.only("pk")), moment=as_of, closed=True
        )
    except (OverflowError, ValueError):  # past the last year a date can hold
        raise BillingInputError("as_of", "is later than any billing period") from None
    for start, end in sorted(periods):
        if start >= now:
            raise BillingInputError(
                "as_of",
                f"{as_of:%Y-%m-%d %H:%M} UTC picks the billing period {start:%Y-%m-%d} to "
                f"{end:%Y-%m-%d}, which has not begun",
            )
    open_periods = sorted((end, start) for start, end in periods if end > now)
    if not finalize or not open_periods:
        return None
    end, start = open_periods[-1]
    return finalize_early_check(period_start=start, period_end=end, now=now, early=early)


def invoice_run_execute(
    *, run_id: int, progress: Progress | None = None, current_period: bool = False
) -> InvoiceRun:
    """`current_period`: the period still running at `as_of` instead of the
    last closed one (drafts so far, as the demo shows; a draft is rebuilt
    and finalized when its period has ended)."""
    run = InvoiceRun.objects.get(pk=run_id)
    runs_abandoned_fail(InvoiceRun)
    with run_executing(run):
        _execute(run, progress=progress, current_period=current_period)
    run.refresh_from_db()
    return run


def _execute(run: InvoiceRun, *, progress: Progress | None, current_period: bool) -> None:
    report = progress
    # Suspended tenants too: what they used before is still owed.
    tenants = list(Tenant.objects.order_by("pk"))
    run_start(
        run,
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
                _count(outcomes, counts, failures, warnings, done_before, run_id=run.pk)
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
    run_finish(run, failed=bool(failures))


def _count(outcomes, counts, failures, warnings, done_before, *, run_id: int) -> None:
    """Running totals from a period group's outcomes so far. An invoice
    found final that this run wrote (a chunk redone one by one after its
    commit, a message delivered again) counts as this run's, not skipped."""
    fresh = outcomes[counts["done"] - done_before :]
    for o in fresh:
        ours = o.outcome == "final" and o.invoice is not None and o.invoice.run_id == run_id
        if o.outcome == "failed":
            failures.append({"tenant": o.tenant.slug, "error": o.error})
        elif o.outcome in ("created", "rebuilt") or ours:
            counts["created"] += 1
            warnings += [f"{o.tenant.slug}: {w}" for w in o.invoice.warnings]
        else:
            counts["skipped"] += 1
    counts["done"] += len(fresh)


def invoice_run_summary(*, run: InvoiceRun) -> dict[str, int]:
    """What a run did, for a person: invoices it finalized and drafts it
    left (read from the invoices it wrote), tenants skipped (already
    invoiced, or nothing to bill) and tenants that failed."""
    statuses = list(run.invoices.values_list("status", flat=True))
    drafts = statuses.count(InvoiceStatus.DRAFT)
    return {
        "finalized": len(statuses) - drafts,
        "drafts": drafts,
        "skipped": run.invoices_skipped,
        "failed": len(run.failures),
    }


def _progress_save(run: InvoiceRun, counts, failures, warnings) -> None:
    run_progress(
        run,
        tenants_done=counts["done"],
        invoices_created=counts["created"],
        invoices_skipped=counts["skipped"],
        failures=failures,
        warnings=warnings[:200],
    )
