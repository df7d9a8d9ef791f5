"""One request followed through the platform: what the gateway recorded,
the device-seconds attribution gave it window by window, the hourly rollup
it was counted in, the invoice and the lines that bill that hour, and for
finance staff its share of the hour's allocated GPU cost and the tenant's
margin in the latest report. A tenant's member sees only its own requests,
and only issued invoices."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db.models import Sum
from django.http import Http404
from django.shortcuts import render

from billing.costs.selectors import margin_report_latest
from billing.invoicing.selectors import invoice_list
from billing.models import CostAllocation
from metering.models import UsageEvent
from metering.selectors import request_device_seconds, request_get, rollup_of_request
from tenants.access import principal_for_session


@login_required
def request_trace(request, request_id: str):
    principal = principal_for_session(request)
    if principal is None or (principal.tenant is None and not principal.is_finance):
        raise PermissionDenied
    tenant = principal.tenant  # None: finance staff, every tenant
    try:
        event = request_get(tenant=tenant, request_id=request_id)
    except UsageEvent.DoesNotExist:
        raise Http404("no such request") from None
    windows = sorted(request_device_seconds(tenant=tenant, request_id=request_id).items())
    device_seconds = sum((seconds for _, seconds in windows), Decimal(0))
    hour = event.received_at.replace(minute=0, second=0, microsecond=0)
    rollup = rollup_of_request(event=event)
    invoice = (
        invoice_list(tenant=tenant)
        .filter(tenant_id=event.tenant_id, period_start__lte=hour, period_end__gt=hour)
        .prefetch_related("lines")
        .first()
    )
    lines = [
        line
        for line in (invoice.lines.all() if invoice else [])
        if line.service_start <= hour < line.service_end
        and (not line.model or line.model == event.model)
    ]
    context = {
        "event": event,
        "windows": windows,
        "device_seconds": device_seconds,
        "hour": hour,
        "rollup": rollup,
        "invoice": invoice,
        "lines": lines,
        "finance": tenant is None,
    }
    if tenant is None:
        context |= _cost_and_margin(event, hour=hour, device_seconds=device_seconds)
    return render(request, "billing/request_trace.html", context)


def _cost_and_margin(event: UsageEvent, *, hour, device_seconds: Decimal) -> dict:
    """The hour's booked cost for this tenant, model and pool, and this
    request's part of it by device-seconds (allocation splits by them)."""
    allocated = CostAllocation.objects.filter(
        scenario=None,
        hour=hour,
        tenant_id=event.tenant_id,
        pool_id=event.pool_id,
        served_model_id=event.served_model_id,
    ).aggregate(total=Sum("total"), seconds=Sum("device_seconds"))
    share = None
    if allocated["total"] is not None and allocated["seconds"]:
        share = (allocated["total"] * device_seconds / allocated["seconds"]).quantize(
            Decimal("0.000000001")
        )
    report = margin_report_latest(moment=hour)
    margin = None
    if report is not None:
        margin = next(
            (row for row in report.tables.get("tenant", []) if row["tenant"] == event.tenant.slug),
            None,
        )
    return {"allocated": allocated, "cost_share": share, "report": report, "margin": margin}
