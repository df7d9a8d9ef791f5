"""Invoice pages: the list (a tenant's own issued invoices; every tenant's
for finance staff) and one invoice as a print-ready document, also
downloadable as a self-contained HTML file that prints to PDF. Finance
staff act on it there: finalize, mark paid, void, mark uncollectible,
issue a credit note, waive or adjust a draft's SLA credit (with a reason;
a finalized invoice's are fixed). A draft whose period has not ended offers
"Finalize early" with a required reason instead of "Finalize" (the same
rule as the API and the invoice run:
billing.invoicing.finalizing.finalize_early_check)."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.choices import InvoiceStatus, LineKind, RunStatus, SlaAdjustmentAction
from billing.errors import BillingInputError, InvoiceStateError
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.finalizing import finalize_early_request
from billing.invoicing.invoices import invoice_amount_due_minor, invoice_status_set
from billing.invoicing.selectors import invoice_get, invoice_list, invoice_run_list
from billing.invoicing.sla_adjustments import sla_credit_adjust
from billing.invoicing.sla_credits import sla_decisions
from billing.tax.selectors import tax_details_request_of, tax_profile_of
from billing.tax.services import tax_by_rate, tax_details_set
from dashboard.forms import (
    CREDIT_NOTE,
    InvoiceActionForm,
    InvoiceFilterForm,
    SlaCreditForm,
    form_error,
)
from tenants.access import finance_staff_required, principal_for_session

PAGE_SIZE = 50
# The moves each status offers on the page (the state machine has the last word).
INVOICE_ACTIONS = {
    InvoiceStatus.DRAFT: [(InvoiceStatus.FINALIZED, "Finalize")],
    InvoiceStatus.FINALIZED: [
        (InvoiceStatus.PAID, "Mark paid"),
        (InvoiceStatus.VOID, "Void"),
        (InvoiceStatus.UNCOLLECTIBLE, "Mark uncollectible"),
    ],
    InvoiceStatus.UNCOLLECTIBLE: [(InvoiceStatus.PAID, "Mark paid"), (InvoiceStatus.VOID, "Void")],
}


def _scope(request):
    principal = principal_for_session(request)
    if principal.for_platform:
        return None
    if principal.tenant is None:
        raise PermissionDenied
    return principal.tenant


@login_required
def invoices(request):
    return invoices_page(request)


def invoices_page(
    request, *, error: str = "", tax_error: dict | None = None, http_status: int = 200
):
    """The list; for finance staff also the runs, and a run form's error;
    for a tenant its tax details, which its owners and admins set."""
    tenant = _scope(request)
    status = InvoiceFilterForm(request.GET).status_value()
    page = Paginator(invoice_list(tenant=tenant, status=status), PAGE_SIZE).get_page(
        request.GET.get("page")
    )
    rows = list(page.object_list)
    for invoice in rows:
        invoice.amount_due_minor = invoice_amount_due_minor(invoice)
    runs = list(invoice_run_list()[:10]) if tenant is None else []
    context = {
        "invoices": rows,
        "page": page,
        "statuses": InvoiceStatus.choices,
        "status": status,
        "all": tenant is None,
        "runs": runs,
        "active": any(r.status in (RunStatus.QUEUED, RunStatus.RUNNING) for r in runs),
        "error": error,
        "run_form": request.POST if error else {},
        "tax_profile": tax_profile_of(tenant=tenant) if tenant else None,
        "tax_request": tax_details_request_of(tenant=tenant) if tenant else None,
        "can_set_tax": tenant is not None and principal_for_session(request).can_manage_keys,
        "tax_error": tax_error,
        "tax_form": request.POST if tax_error else None,
    }
    return render(request, "dashboard/invoices.html", context, status=http_status)


@login_required
@require_POST
def tax_details(request):
    """A tenant's owners and admins set its country and VAT/GST id; a bad
    one re-shows the page with a 400 naming the field, nothing written."""
    principal = principal_for_session(request)
    if not principal.can_manage_keys:  # finance staff set profiles on /finance/tax/
        raise PermissionDenied
    try:
        waiting = tax_details_set(
            tenant=principal.tenant,
            country=request.POST.get("country"),
            tax_id=request.POST.get("tax_id", ""),
            by=request.user,
        )
    except BillingInputError as error:
        problem = {"field": error.field, "message": error.message}
        return invoices_page(request, tax_error=problem, http_status=400)
    if waiting is None:
        messages.success(request, "Tax details unchanged.")
    else:
        messages.success(
            request,
            f"Tax details sent ({waiting.country}): our finance staff confirm them before "
            "invoices use them.",
        )
    return redirect("invoices")


def _invoice(request, pk: int):
    try:
        return invoice_get(tenant=_scope(request), pk=pk)
    except ObjectDoesNotExist:  # another tenant's, or none
        raise Http404("no such invoice") from None


@login_required
def invoice_document(request, pk: int):
    return _document(request, _invoice(request, pk))


@finance_staff_required
@require_POST
def invoice_action(request, pk: int):
    """One of finance staff's moves; a bad one re-shows the invoice with a
    400 naming the field, a refused one with a 409; nothing is changed."""
    invoice = _invoice(request, pk)
    form = InvoiceActionForm(request.POST, currency=invoice.currency)
    if not form.is_valid():
        return _document(request, invoice, error=form_error(form), status=400)
    action, reason = form.cleaned_data["action"], form.cleaned_data["reason"]
    try:
        if action == CREDIT_NOTE:
            note = credit_note_create(
                invoice_id=invoice.pk,
                amount_minor=form.cleaned_data["amount"],
                reason=reason,
                created_by=request.user,
            )
            messages.success(request, f"Credit note {note.number} issued.")
        else:
            early = None
            if form.cleaned_data["finalize_early"]:
                early = finalize_early_request(reason=reason, by=request.user.get_username())
            invoice = invoice_status_set(invoice_id=invoice.pk, to=action, early=early)
            messages.success(request, f"Invoice {invoice.number} is now {invoice.status}.")
    except BillingInputError as error:
        return _document(request, invoice, error=f"{error.field}: {error.message}", status=400)
    except InvoiceStateError as error:
        return _document(request, invoice, error=str(error), status=409)
    return redirect("invoice", pk=invoice.pk)


@finance_staff_required
@require_POST
def invoice_sla_credit(request, pk: int):
    """Waive or adjust a draft's SLA credit; a bad form re-shows the invoice
    with a 400 naming the field, a finalized invoice with a 409."""
    invoice = _invoice(request, pk)
    form = SlaCreditForm(request.POST)
    if not form.is_valid():
        return _document(request, invoice, error=form_error(form), status=400)
    try:
        sla_credit_adjust(invoice_id=invoice.pk, by=request.user, **form.cleaned_data)
    except BillingInputError as error:
        return _document(request, invoice, error=f"{error.field}: {error.message}", status=400)
    except InvoiceStateError as error:
        return _document(request, invoice, error=str(error), status=409)
    done = SlaAdjustmentAction(form.cleaned_data["action"]).label.lower()
    messages.success(request, f"SLA credit for {form.cleaned_data['metric']} {done}.")
    return redirect("invoice", pk=invoice.pk)


def _document(request, invoice, *, error: str = "", status: int = 200):
    lines = list(invoice.lines.all())
    principal = principal_for_session(request)
    net_days = settings.BILLING["NET_DAYS"]
    can_act = principal.for_platform
    sla = [line for line in lines if line.kind == LineKind.SLA_CREDIT]
    decisions = (
        sla_decisions(tenant_id=invoice.tenant_id, period_start=invoice.period_start)
        if can_act
        else []
    )
    context = {
        "invoice": invoice,
        "usage": [
            line
            for line in lines
            if not line.late and line.kind not in (LineKind.CREDIT, LineKind.SLA_CREDIT)
        ],
        "late": [line for line in lines if line.late],
        "sla_credits": sla,
        # Finance may decide on a draft's credits: those on it, and those
        # decided before (a waived one has no line left).
        "sla_adjustable": sorted({line.sla_metric for line in sla} | {d.metric for d in decisions})
        if can_act and invoice.status == InvoiceStatus.DRAFT
        else [],
        "sla_decisions": decisions,
        "credits": [line for line in lines if line.kind == LineKind.CREDIT],
        "taxes": tax_by_rate(lines),
        "amount_due_minor": invoice_amount_due_minor(invoice),
        "download": "download" in request.GET,
        "can_act": can_act,
        "actions": INVOICE_ACTIONS.get(invoice.status, []),
        # A draft: not issued yet; issued when finalized, due net_days later.
        "period_open": not invoice.is_final and invoice.period_end > timezone.now(),
        "net_days": net_days,
        "expected_due": invoice.period_end + timedelta(days=net_days),
        "early_reason": request.POST.get("reason", "") if error else "",
        "messages": messages.get_messages(request),
        "error": error,
    }
    response = render(request, "dashboard/invoice_document.html", context, status=status)
    if context["download"]:
        name = invoice.number or f"draft-{invoice.pk}"
        response["Content-Disposition"] = f'attachment; filename="{name}.html"'
    return response
