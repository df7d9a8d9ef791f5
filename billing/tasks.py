"""Celery tasks of billing (cost allocation, invoicing, Stripe): thin,
safe to run twice."""

from __future__ import annotations

from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from billing.costs.checks import allocation_conservation_check
from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.invoicing.reproduction import reproduction_check
from billing.invoicing.runs import invoice_run_create, invoice_run_execute
from billing.models import AllocationRun, InvoiceRun, MarginReport
from billing.payments.stripe_api import TRANSIENT_ERRORS
from billing.payments.sync import invoice_stripe_sync, invoices_awaiting_sync
from billing.queueing import INVOICE_STRIPE_SYNC_TASK
from billing.reports.margin_reports import margin_report_build, margin_report_request, report_period
from billing.runs import run_enqueue, run_task, runs_abandoned_fail
from billing.sla.notices import slo_breaches_emit
from billing.spend.budgets import budgets_check
from billing.spend.corrections import spend_corrections_write


@shared_task(
    name="billing.costs.runs",
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=3600,
    soft_time_limit=3540,
    ignore_result=True,
)
def allocation_run_task(run_id: int) -> str:
    """Compute one queued run. Acknowledged only when done, so a worker
    killed mid-run hands it to the next worker, which rewrites it whole.
    Whatever it raises fails the run, the error on its page (run_task)."""
    with run_task(AllocationRun, run_id):
        return allocation_run_execute(run_id=run_id).status


def allocation_run_enqueue(run_id: int) -> None:
    run_enqueue(allocation_run_task, AllocationRun, run_id, what="allocation run", error=str)


@shared_task(
    name="billing.allocation_daily", time_limit=3600, soft_time_limit=3540, ignore_result=True
)
def allocation_daily_task() -> int:
    """Daily: book yesterday (UTC)."""
    today = timezone.now().replace(hour=0, minute=0, second=0, microsecond=0)
    run = allocation_run_create(start=today - timedelta(days=1), end=today)
    with run_task(AllocationRun, run.pk):
        return allocation_run_execute(run_id=run.pk).pk


@shared_task(name="billing.slo_breaches", time_limit=600, soft_time_limit=540, ignore_result=True)
def slo_breaches_task() -> int:
    """Daily: slo.breached for each tenant that missed its service level yesterday (UTC)."""
    yesterday = (timezone.now() - timedelta(days=1)).date()
    return len(slo_breaches_emit(day=yesterday))


@shared_task(
    name="billing.allocation_check", time_limit=600, soft_time_limit=540, ignore_result=True
)
def allocation_check_task() -> int:
    """Daily, after the allocation: pool-hours whose rows do not add up."""
    return len(allocation_conservation_check())


@shared_task(
    name="billing.reproduction_check", time_limit=1800, soft_time_limit=1740, ignore_result=True
)
def reproduction_check_task() -> int:
    """Daily, after the invoices: closed periods whose re-rating differs
    from what was billed for them (expected: none)."""
    return len(reproduction_check().differences)


@shared_task(
    name="billing.invoicing.runs",
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=3600,
    soft_time_limit=3540,
    ignore_result=True,
)
def invoice_run_task(run_id: int) -> str:
    """One queued invoice run. Safe to run again: each tenant is one
    transaction, and finalized invoices are skipped. Whatever it raises
    fails the run, the error on its page (run_task)."""
    with run_task(InvoiceRun, run_id):
        return invoice_run_execute(run_id=run_id).status


def invoice_run_enqueue(run_id: int) -> None:
    run_enqueue(
        invoice_run_task,
        InvoiceRun,
        run_id,
        what="invoice run",
        failures=lambda reason: [{"tenant": "", "error": reason}],
    )


@shared_task(
    name="billing.invoice_daily", time_limit=3600, soft_time_limit=3540, ignore_result=True
)
def invoice_daily_task() -> str:
    """Daily: invoice every tenant whose billing period ended (the monthly
    run of each anchor day)."""
    run = invoice_run_create(as_of=timezone.now())
    with run_task(InvoiceRun, run.pk):
        return invoice_run_execute(run_id=run.pk).status


@shared_task(
    name=INVOICE_STRIPE_SYNC_TASK,
    autoretry_for=TRANSIENT_ERRORS,
    retry_backoff=5,
    retry_backoff_max=600,
    max_retries=10,
    acks_late=True,
    reject_on_worker_lost=True,
    time_limit=300,
    soft_time_limit=270,
    ignore_result=True,
)
def invoice_stripe_sync_task(invoice_id: int) -> str:
    """Push one invoice to Stripe. Idempotent: keyed writes and saved ids."""
    return invoice_stripe_sync(invoice_id=invoice_id)


@shared_task(name="billing.stripe_sweep", time_limit=300, soft_time_limit=270, ignore_result=True)
def stripe_sweep_task() -> int:
    """Every few minutes: queue what is not yet in step with Stripe (a sync
    that exhausted its retries while Stripe was down, one the broker
    refused when it was asked for, a lost message)."""
    ids = invoices_awaiting_sync()
    for invoice_id in ids:
        invoice_stripe_sync_task.delay(invoice_id)
    return len(ids)


@shared_task(name="billing.runs_abandoned", time_limit=60, soft_time_limit=55, ignore_result=True)
def runs_abandoned_task() -> int:
    """Every few minutes: runs still marked running whose worker died
    (killed, out of memory, its host lost) marked failed, so no page says
    running for the hour until the broker hands their message again."""
    return sum(runs_abandoned_fail(model) for model in (AllocationRun, InvoiceRun, MarginReport))


@shared_task(name="billing.budgets_check", time_limit=55, soft_time_limit=50, ignore_result=True)
def budgets_check_task() -> int:
    """Every minute: alert at the soft threshold, block at the hard one,
    unblock after a raise or when a new period begins."""
    return sum(check.blocked for check in budgets_check())


@shared_task(name="billing.spend_correct", time_limit=280, soft_time_limit=270, ignore_result=True)
def spend_correct_task() -> int:
    """Every five minutes: the ledger's spend of each held account up to
    the last closed hour, for the gateways to correct their counters."""
    return len(spend_corrections_write())


@shared_task(
    name="billing.margin_report", time_limit=1800, soft_time_limit=1740, ignore_result=True
)
def margin_report_task(report_id: int) -> str:
    with run_task(MarginReport, report_id):
        return margin_report_build(report_id=report_id).status


def margin_report_enqueue(report_id: int) -> None:
    run_enqueue(margin_report_task, MarginReport, report_id, what="margin report", error=str)


@shared_task(
    name="billing.margin_report_scheduled",
    time_limit=1800,
    soft_time_limit=1740,
    ignore_result=True,
)
def margin_report_scheduled_task(kind: str) -> str:
    """The weekly flash (Mondays), the monthly close (the 2nd) or the
    month to date (nightly, for the finance overview)."""
    start, end = report_period(kind=kind, now=timezone.now())
    report = margin_report_request(kind=kind, start=start, end=end)
    with run_task(MarginReport, report.pk):
        return margin_report_build(report_id=report.pk).status
