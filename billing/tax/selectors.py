"""What pages read of tax: the rates, and the tenants' profiles."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.models import TaxDetailsRequest, TaxProfile, TaxRate


def tax_rate_list() -> QuerySet[TaxRate]:
    return TaxRate.objects.all()


def tax_profile_list() -> QuerySet[TaxProfile]:
    return TaxProfile.objects.select_related("tenant").order_by("tenant__slug")


def tax_profile_of(*, tenant) -> TaxProfile | None:
    return TaxProfile.objects.filter(tenant=tenant).first()


def tax_details_request_of(*, tenant) -> TaxDetailsRequest | None:
    """The tax details the tenant sent, waiting for finance (None: none)."""
    return TaxDetailsRequest.objects.filter(tenant=tenant).first()


def tax_details_requests() -> QuerySet[TaxDetailsRequest]:
    """Every tenant's details waiting for finance to confirm (finance staff only)."""
    return TaxDetailsRequest.objects.select_related("tenant").order_by("requested_at")
