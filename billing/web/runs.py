"""Finance staff start runs from the dashboard: an allocation of whole UTC
days on the cost page, an invoice run on the invoices page. Each is
queued to a worker and watched in the page's run table. Bad input re-shows
the page with a 400 naming the field, and nothing is queued."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import redirect
from django.utils import timezone
from django.views.decorators.http import require_POST

from billing.costs.runs import allocation_run_create
from billing.errors import BillingInputError, InvoicePeriodOpenError
from billing.invoicing.invoices import finalize_early_request
from billing.invoicing.runs import invoice_run_create
from billing.tasks import allocation_run_enqueue, invoice_run_enqueue
from billing.web.costs import costs_page
from billing.web.invoices import invoices_page
from tenants.access import finance_staff_required


def day_parse(text: str, *, field: str) -> datetime:
    """A YYYY-MM-DD form field as that day's 00:00 UTC."""
    try:
        day = date.fromisoformat(text.strip())
    except ValueError:
        raise BillingInputError(field, "a day as YYYY-MM-DD is needed") from None
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def allocation_period(post) -> tuple[datetime, datetime]:
    """[first day 00:00, the day after the last day 00:00), cut at the
    current hour: hours still to come have nothing to allocate yet."""
    start = day_parse(post.get("first_day", ""), field="first_day")
    end = day_parse(post.get("last_day", ""), field="last_day") + timedelta(days=1)
    if end <= start:
        raise BillingInputError("last_day", "must be on or after first_day")
    now_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    if start >= now_hour:
        raise BillingInputError("first_day", "must be before the current hour")
    return start, min(end, now_hour)


@finance_staff_required
@require_POST
def allocation_run_start(request):
    try:
        start, end = allocation_period(request.POST)
        with transaction.atomic():
            run = allocation_run_create(start=start, end=end, user=request.user)
            allocation_run_enqueue(run.pk)
    except BillingInputError as error:
        return costs_page(request, error=f"{error.field}: {error.message}", http_status=400)
    except ValidationError as error:
        field, problems = next(iter(error.message_dict.items()))
        field = {"start": "first_day", "end": "last_day"}.get(field, field)
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
    text = request.POST.get("as_of", "").strip()
    finalize = request.POST.get("drafts") != "on"
    try:
        as_of = day_parse(text, field="as_of") if text else timezone.now()
        early = None
        if request.POST.get("finalize_early") == "on":
            early = finalize_early_request(
                reason=request.POST.get("reason"), by=request.user.get_username()
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
