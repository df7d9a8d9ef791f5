"""Invoice pages: the list (a tenant's own issued invoices; every tenant's
for finance staff) and one invoice as a print-ready document, also
downloadable as a self-contained HTML file that prints to PDF."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render

from billing.choices import InvoiceStatus, RunStatus
from billing.invoice_selectors import invoice_get, invoice_list, invoice_run_list
from billing.invoices import invoice_amount_due_minor
from billing.models import Invoice
from tenants.access import principal_for_session


def _scope(request):
    principal = principal_for_session(request)
    if principal.is_finance and principal.tenant is None:
        return None
    if principal.tenant is None:
        raise PermissionDenied
    return principal.tenant


@login_required
def invoices(request):
    tenant = _scope(request)
    status = request.GET.get("status") or None
    if status not in (None, *InvoiceStatus.values):
        status = None
    rows = list(invoice_list(tenant=tenant, status=status)[:200])
    for invoice in rows:
        invoice.amount_due_minor = invoice_amount_due_minor(invoice)
    runs = list(invoice_run_list()[:10]) if tenant is None else []
    context = {
        "invoices": rows,
        "statuses": InvoiceStatus.choices,
        "status": status,
        "all": tenant is None,
        "runs": runs,
        "active": any(r.status in (RunStatus.QUEUED, RunStatus.RUNNING) for r in runs),
    }
    return render(request, "billing/invoices.html", context)


@login_required
def invoice_document(request, pk: int):
    try:
        invoice = invoice_get(tenant=_scope(request), pk=pk)
    except Invoice.DoesNotExist:
        raise Http404("no such invoice") from None
    lines = list(invoice.lines.all())
    context = {
        "invoice": invoice,
        "usage": [line for line in lines if not line.late and line.kind != "credit"],
        "late": [line for line in lines if line.late],
        "credits": [line for line in lines if line.kind == "credit"],
        "amount_due_minor": invoice_amount_due_minor(invoice),
        "download": "download" in request.GET,
    }
    response = render(request, "billing/invoice_document.html", context)
    if context["download"]:
        name = invoice.number or f"draft-{invoice.pk}"
        response["Content-Disposition"] = f'attachment; filename="{name}.html"'
    return response
