"""The audit trail's page (/audit/): finance staff see every entry, a
tenant's owners their own tenant's; filters, a page at a time, and the
whole selection as CSV (?format=csv)."""

from __future__ import annotations

from dataclasses import replace

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.shortcuts import render

from audit.forms import AuditFilterForm
from audit.selectors import (
    CSV_COLUMNS,
    AuditQuery,
    audit_csv_rows,
    audit_entry_list,
    entry_changes,
    entry_record,
)
from core.csv_stream import csv_response
from tenants.access import principal_for_session
from tenants.choices import Role

PAGE = 100


@login_required
def audit_page(request):
    principal = principal_for_session(request)
    if principal.for_platform:
        tenant = None
    elif principal.tenant is not None and principal.role == Role.OWNER:
        tenant = principal.tenant
    else:
        raise PermissionDenied
    form = AuditFilterForm(request.GET or None)
    if form.is_bound and not form.is_valid():
        context = {"form": form, "entries": [], "tenant": tenant}
        return render(request, "dashboard/audit.html", context, status=400)
    query = form.query() if form.is_bound else AuditQuery()
    if tenant is not None:
        query = replace(query, tenant_slug="")
    entries = audit_entry_list(
        tenant=tenant, query=query, reader_is_tenant=not principal.for_platform
    )
    if request.GET.get("format") == "csv":
        return csv_response(audit_csv_rows(entries), columns=CSV_COLUMNS, filename="audit.csv")
    before = request.GET.get("before", "")
    if before.isdigit():
        entries = entries.filter(id__lt=int(before))
    page = list(entries[: PAGE + 1])
    more = page[PAGE].id if len(page) > PAGE else None
    rows = [{**entry_record(e), "changes": entry_changes(e)} for e in page[:PAGE]]
    query_string = request.GET.copy()
    query_string.pop("before", None)
    context = {
        "form": form,
        "entries": rows,
        "tenant": tenant,
        "next_before": rows[-1]["id"] if more else None,
        "query": query_string.urlencode(),
    }
    return render(request, "dashboard/audit.html", context)
