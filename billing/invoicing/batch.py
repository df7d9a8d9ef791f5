"""Invoicing many tenants of one period (the invoice run) through the
one path, billing.invoicing.invoices: what rating reads is loaded once
for all of them (`period_reads`), then they are invoiced a chunk at a
time, each chunk one transaction (`invoices_bill`), so reads and writes
stay in bulk however many tenants. In a chunk a tenant whose rating
fails is reported and left as it was; a chunk that fails as a whole (its
write) is done again tenant by tenant, so one tenant never holds back
the others."""

from __future__ import annotations

import logging
from datetime import datetime

from billing.errors import InvoicePeriodOpenError
from billing.invoicing.finalizing import finalize_early_check, finalize_early_of_run, issue_moment
from billing.invoicing.invoices import Outcome, invoices_bill, period_reads
from billing.models import InvoiceRun
from tenants.models import Tenant

logger = logging.getLogger(__name__)
CHUNK = 250


def invoices_bill_many(
    *,
    tenants: list[Tenant],
    start: datetime,
    end: datetime,
    run: InvoiceRun | None,
    finalize: bool,
    progress=None,
) -> list[Outcome]:
    """An outcome per tenant, in their order; `progress` is called with
    the outcomes so far after each chunk."""
    if finalize:  # a period not ended: every tenant refused, unless the run finalizes early
        try:
            finalize_early_check(
                period_start=start,
                period_end=end,
                now=issue_moment(run),
                early=finalize_early_of_run(run),
            )
        except InvoicePeriodOpenError as refused:
            outcomes = [Outcome(t, "failed", error=str(refused)) for t in tenants]
            if progress:
                progress(outcomes)
            return outcomes
    reads = period_reads(tenants=tenants, start=start, end=end)
    outcomes: list[Outcome] = []
    for at in range(0, len(tenants), CHUNK):
        chunk = tenants[at : at + CHUNK]
        try:
            outcomes += invoices_bill(
                tenants=chunk,
                start=start,
                end=end,
                run=run,
                finalize=finalize,
                reads=reads,
                isolate=True,
            )
        except Exception:
            logger.exception("invoice chunk failed; invoicing its tenants one by one")
            outcomes += [_tenant_bill(t, start, end, run, finalize) for t in chunk]
        if progress:
            progress(outcomes)
    return outcomes


def _tenant_bill(tenant: Tenant, start, end, run, finalize) -> Outcome:
    """One tenant of a failed chunk alone: what fails now is its own."""
    try:
        (outcome,) = invoices_bill(
            tenants=[tenant], start=start, end=end, run=run, finalize=finalize
        )
        return outcome
    except Exception as exc:
        logger.exception("invoicing %s failed", tenant.slug)
        return Outcome(tenant, "failed", error=f"{type(exc).__name__}: {exc}")
