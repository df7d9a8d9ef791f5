"""One request followed through the platform: what the gateway recorded,
the device-seconds attribution gave it window by window, the hourly rollup
it was counted in, its own charge priced part by part, the invoice lines it
fed (its model and token kinds only), and for finance staff its share of
the hour's allocated GPU cost and the tenant's margin in the latest
report. A tenant's member sees only its own requests, and only issued
invoices."""

from __future__ import annotations

from decimal import Decimal

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import render

from billing.costs.selectors import margin_report_latest
from billing.reports.request_trace import (
    request_charge,
    request_cost_share,
    request_invoice,
    request_invoice_lines,
)
from metering.selectors.requests import request_device_seconds, request_events, rollup_of_request
from tenants.access import principal_for_session


@login_required
def request_trace(request, request_id: str):
    principal = principal_for_session(request)
    if principal is None or (principal.tenant is None and not principal.is_finance):
        raise PermissionDenied
    tenant = principal.tenant  # None: finance staff, every tenant
    # Its rows read once (on the scaled path, from the store's hour or two).
    events = request_events(tenant=tenant, request_id=request_id)
    if not events:  # another tenant's, or none
        raise Http404("no such request")
    event = events[0]  # a disaggregated request's decode row
    windows = sorted(
        request_device_seconds(tenant=tenant, request_id=request_id, events=events).items()
    )
    device_seconds = sum((seconds for _, seconds in windows), Decimal(0))
    hour = event.received_at.replace(minute=0, second=0, microsecond=0)
    charge = request_charge(
        tenant=tenant, event=event, device_seconds=device_seconds, events=events
    )
    invoice = request_invoice(tenant=tenant, event=event)
    context = {
        "event": event,
        "windows": windows,
        "device_seconds": device_seconds,
        "hour": hour,
        "rollup": rollup_of_request(event=event),
        "charge": charge,
        "invoice": invoice,
        "lines": request_invoice_lines(
            invoice=invoice, event=event, charge=charge, device_seconds=device_seconds
        ),
        "finance": tenant is None,
    }
    if tenant is None:
        context["cost"] = request_cost_share(event=event, windows=windows)
        context |= _margin(event, hour=hour)
    return render(request, "dashboard/request_trace.html", context)


def _margin(event, *, hour) -> dict:
    """The tenant's row of the latest stored margin report covering the hour."""
    report = margin_report_latest(moment=hour)
    margin = None
    if report is not None:
        margin = next(
            (row for row in report.tables.get("tenant", []) if row["tenant"] == event.tenant.slug),
            None,
        )
    return {"report": report, "margin": margin}
