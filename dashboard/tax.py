"""The tax page (/finance/tax/), finance staff only: the dated rates per
jurisdiction, with a form to add one, and each tenant's tax profile
(country, VAT/GST id, exemption), with a form to set one. A bad country,
tax id, percent or day is a 400 naming the field, nothing written
(billing.tax.services, the API's path too)."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import ObjectDoesNotExist
from django.shortcuts import redirect, render

from billing.errors import BillingInputError
from billing.tax.selectors import tax_details_requests, tax_profile_list, tax_rate_list
from billing.tax.services import tax_details_confirm, tax_profile_set, tax_rate_create
from tenants.access import finance_staff_required
from tenants.selectors import tenant_for_finance, tenant_list_for_finance


@finance_staff_required
def tax_page(request):
    errors: dict[str, str] = {}
    form = request.POST if request.method == "POST" else {}
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "rate":
                rate = tax_rate_create(
                    country=request.POST.get("country"),
                    name=request.POST.get("name"),
                    percent=request.POST.get("percent", ""),
                    valid_from=request.POST.get("valid_from", ""),
                )
                messages.success(request, f"{rate} added.")
            elif action == "profile":
                slug = request.POST.get("tenant", "")
                try:
                    tenant = tenant_for_finance(slug=slug)
                except ObjectDoesNotExist:
                    raise BillingInputError("tenant", f"no tenant {slug!r}") from None
                profile = tax_profile_set(
                    tenant=tenant,
                    country=request.POST.get("country"),
                    tax_id=request.POST.get("tax_id", ""),
                    exempt=request.POST.get("exempt") == "on",
                    exempt_reason=request.POST.get("exempt_reason", ""),
                )
                messages.success(request, f"Tax profile of {tenant.slug} set: {profile.country}.")
            elif action == "confirm":
                slug = request.POST.get("tenant", "")
                try:
                    tenant = tenant_for_finance(slug=slug)
                except ObjectDoesNotExist:
                    raise BillingInputError("tenant", f"no tenant {slug!r}") from None
                profile = tax_details_confirm(tenant=tenant)
                messages.success(request, f"Tax details of {tenant.slug} confirmed: {profile}.")
            else:
                raise BillingInputError("action", "rate, profile or confirm")
        except BillingInputError as error:
            errors = {"action": action or "", "field": error.field, "message": error.message}
        else:
            return redirect("tax")
    context = {
        "rates": tax_rate_list(),
        "profiles": tax_profile_list(),
        "requests": tax_details_requests(),
        "tenants": tenant_list_for_finance(),
        "errors": errors,
        "form": form,
    }
    return render(request, "dashboard/tax.html", context, status=400 if errors else 200)
