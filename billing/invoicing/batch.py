"""Invoicing many tenants of one period at once, as the invoice run does:
rating inputs read in a handful of queries for all of them, then tenants
written a chunk at a time (one transaction per chunk, invoices, lines and
credit in bulk, the chunk's numbers taken in one step). A chunk that
fails to write is redone tenant by tenant through the one-invoice path,
so each tenant still ends fully invoiced or untouched."""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from billing.choices import InvoiceStatus, StripeSync
from billing.errors import InvoicePeriodOpenError
from billing.invoicing.credits import wallet_balances
from billing.invoicing.invoices import (
    FinalizeEarly,
    credits_apply,
    draft_compose,
    draft_fill,
    finalize_early_check,
    finalize_early_of_run,
    invoice_bill_period,
    number_assign,
    numbers_take,
)
from billing.invoicing.late_usage import earlier_periods
from billing.models import CreditApplication, CreditGrant, Invoice, InvoiceLine, InvoiceRun
from billing.payments.sync import sync_enqueue
from billing.pricing.rating import rating_inputs
from tenants.models import Tenant

logger = logging.getLogger(__name__)
CHUNK = 250


@dataclass
class Outcome:
    tenant: Tenant
    outcome: str  # created | rebuilt | final | empty | failed
    invoice: Invoice | None = None
    error: str = ""


def invoices_bill_many(
    *,
    tenants: list[Tenant],
    start: datetime,
    end: datetime,
    run: InvoiceRun | None,
    finalize: bool,
    progress=None,
) -> list[Outcome]:
    early = None
    if finalize:  # a period not ended: every tenant refused, unless the run finalizes early
        try:
            early = finalize_early_check(
                period_start=start,
                period_end=end,
                now=timezone.now(),
                early=finalize_early_of_run(run),
            )
        except InvoicePeriodOpenError as refused:
            outcomes = [Outcome(t, "failed", error=str(refused)) for t in tenants]
            if progress:
                progress(outcomes)
            return outcomes
    final = set(
        Invoice.objects.filter(tenant__in=tenants, period_start=start)
        .exclude(status__in=[InvoiceStatus.VOID, InvoiceStatus.DRAFT])
        .values_list("tenant_id", flat=True)
    )
    to_rate = [t for t in tenants if t.pk not in final]  # a re-run rates only what is left
    inputs = rating_inputs(tenants=to_rate, start=start, end=end) if to_rate else {}
    earlier = earlier_periods(tenants=to_rate, before=start)
    with_credit = set(
        CreditGrant.objects.filter(tenant__in=tenants).values_list("tenant_id", flat=True)
    )
    outcomes: list[Outcome] = []
    for at in range(0, len(tenants), CHUNK):
        chunk = tenants[at : at + CHUNK]
        try:
            outcomes += _chunk_bill(
                chunk, start, end, run, finalize, inputs, earlier, with_credit, early
            )
        except Exception:
            logger.exception("invoice chunk failed; invoicing its tenants one by one")
            outcomes += [_one(t, start, end, run, finalize) for t in chunk]
        if progress:
            progress(outcomes)
    return outcomes


def _chunk_bill(tenants, start, end, run, finalize, inputs, earlier, with_credit, early):
    now = timezone.now()
    outcomes, built = [], []
    with transaction.atomic():
        ids = [t.pk for t in tenants]
        list(Tenant.objects.select_for_update().filter(pk__in=ids).order_by("pk").only("pk"))
        live = {
            i.tenant_id: i
            for i in Invoice.objects.filter(tenant_id__in=ids, period_start=start).exclude(
                status=InvoiceStatus.VOID
            )
        }
        drafts = [i.pk for i in live.values() if i.status == InvoiceStatus.DRAFT]
        InvoiceLine.objects.filter(invoice_id__in=drafts).delete()
        CreditApplication.objects.filter(invoice_id__in=drafts).delete()
        Invoice.objects.filter(pk__in=drafts).delete()
        for tenant in tenants:
            existing = live.get(tenant.pk)
            if existing is not None and existing.is_final:
                outcomes.append(Outcome(tenant, "final", existing))
                continue
            try:
                mine = (
                    inputs.get(tenant.pk)
                    or rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
                )  # final when the run began, voided since
                content = draft_compose(
                    tenant=tenant,
                    start=start,
                    end=end,
                    inputs=mine,
                    # Loaded for every tenant rated at the start (the rest: alone).
                    earlier=earlier if tenant.pk in inputs else None,
                )
            except Exception as exc:  # this tenant only: nothing is written for it
                logger.exception("rating %s failed", tenant.slug)
                outcomes.append(Outcome(tenant, "failed", error=f"{type(exc).__name__}: {exc}"))
                continue
            if content is None:
                outcomes.append(Outcome(tenant, "empty"))
                continue
            invoice = Invoice(tenant=tenant, period_start=start, period_end=end)
            draft_fill(invoice, content, run=run)
            built.append((invoice, content))
            outcomes.append(Outcome(tenant, "rebuilt" if existing else "created", invoice))
        lines, applications = [], []
        for invoice, content in built:
            own = list(content.lines)
            if finalize and invoice.tenant_id in with_credit:
                balances = wallet_balances(tenant=invoice.tenant, lock=True)
                spent, credit_lines = credits_apply(invoice, balances)
                applications += spent
                own += credit_lines
            lines += [
                InvoiceLine(invoice=invoice, position=n, **line.as_fields())
                for n, line in enumerate(own, start=1)
            ]
        invoices = [invoice for invoice, _ in built]
        final = _numbers_assign(invoices, now=now, early=early) if finalize else {}
        # Written as drafts (lines may only be added to a draft), then moved
        # on in one statement per status.
        Invoice.objects.bulk_create(invoices, batch_size=1000)
        InvoiceLine.objects.bulk_create(lines, batch_size=5000)
        CreditApplication.objects.bulk_create(applications)
        for status, moved in final.items():
            Invoice.objects.filter(pk__in=[i.pk for i in moved]).update(status=status)
            for invoice in moved:
                invoice.status = status
                if invoice.stripe_sync == StripeSync.PENDING:
                    sync_enqueue(invoice.pk)
    return outcomes


def _numbers_assign(
    invoices: list[Invoice], *, now: datetime, early: FinalizeEarly | None
) -> dict[str, list[Invoice]]:
    """Numbers for the chunk, per issuer in one step each; the invoices
    stay drafts in memory, grouped by the status they move on to."""
    by_issuer: dict[int, list[Invoice]] = defaultdict(list)
    for invoice in invoices:
        by_issuer[invoice.issuer_id].append(invoice)
    final: dict[str, list[Invoice]] = defaultdict(list)
    for issuer_id in sorted(by_issuer):
        mine = by_issuer[issuer_id]
        issuer, first = numbers_take(issuer_id=issuer_id, count=len(mine))
        for n, invoice in enumerate(mine):
            number_assign(invoice, issuer=issuer, sequence=first + n, now=now, early=early)
            final[invoice.status].append(invoice)
            invoice.status = InvoiceStatus.DRAFT
    return final


def _one(tenant, start, end, run, finalize) -> Outcome:
    try:
        outcome, invoice = invoice_bill_period(
            tenant=tenant, start=start, end=end, run=run, finalize=finalize
        )
        return Outcome(tenant, outcome, invoice)
    except Exception as exc:
        logger.exception("invoicing %s failed", tenant.slug)
        return Outcome(tenant, "failed", error=f"{type(exc).__name__}: {exc}")
