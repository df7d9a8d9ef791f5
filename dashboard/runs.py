"""Finance staff start runs from the dashboard: an allocation of whole UTC
days on the cost page, an invoice run on the invoices page. Each is
queued to a worker and watched in the page's run table. Bad input re-shows
the page with a 400 naming the field, and nothing is queued."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.costs.runs import allocation_run_create
from billing.errors import BillingInputError, InvoicePeriodOpenError
from billing.invoicing.finalizing import finalize_early_request
from billing.invoicing.runs import invoice_run_create
from billing.tasks import allocation_run_enqueue, invoice_run_enqueue
from dashboard.costs import costs_page
from dashboard.forms import RUN_FIELDS, AllocationRunForm, InvoiceRunForm, form_error
from dashboard.invoices import invoices_page
from tenants.access import finance_staff_required


@finance_staff_required
@require_POST
def allocation_run_start(request):
    form = AllocationRunForm(request.POST)
    if not form.is_valid():
        return costs_page(request, error=form_error(form), http_status=400)
    start, end = form.cleaned_data["start"], form.cleaned_data["end"]
    try:
        with transaction.atomic():
            run = allocation_run_create(start=start, end=end, user=request.user)
            allocation_run_enqueue(run.pk)
    except BillingInputError as error:
        return costs_page(request, error=f"{error.field}: {error.message}", http_status=400)
    except ValidationError as error:
        field, problems = next(iter(error.message_dict.items()))
        field = RUN_FIELDS.get(field, field)
        return costs_page(request, error=f"{field}: {problems[0]}", http_status=400)
    messages.success(
        request,
        f"Allocation run {run.pk} queued: {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC.",
    )
    return redirect("costs")


@finance_staff_required
@require_POST
def invoice_run_start(request):
    """Periods that ended by the start of `as_of` (UTC), or by now when it
    is left empty; `drafts` leaves the invoices as drafts. A day later
    than today picks periods that have not ended: refused (409) unless
    drafts, or `finalize_early` with a reason (the rule of the API and the
    command, in invoice_run_create)."""
    form = InvoiceRunForm(request.POST)
    if not form.is_valid():
        return invoices_page(request, error=form_error(form), http_status=400)
    as_of = form.cleaned_data["as_of"] or timezone.now()
    finalize = not form.cleaned_data["drafts"]
    try:
        early = None
        if form.cleaned_data["finalize_early"]:
            early = finalize_early_request(
                reason=form.cleaned_data["reason"], by=request.user.get_username()
            )
        with transaction.atomic():
            run = invoice_run_create(
                as_of=as_of, finalize=finalize, requested_by=request.user, early=early
            )
            invoice_run_enqueue(run.pk)
    except BillingInputError as error:
        return invoices_page(request, error=f"{error.field}: {error.message}", http_status=400)
    except InvoicePeriodOpenError as error:
        return invoices_page(request, error=str(error), http_status=409)
    kind = "finalized invoices" if finalize else "drafts"
    if run.finalize_early_reason:
        kind = "finalized early: periods not ended yet"
    messages.success(
        request,
        f"Invoice run {run.pk} queued ({kind}, periods ended by {as_of:%Y-%m-%d %H:%M} UTC).",
    )
    return redirect("invoices")
