"""What pages read of tax: the rates, and the tenants' profiles."""

from __future__ import annotations

from django.db.models import QuerySet

from billing.models import TaxProfile, TaxRate


def tax_rate_list() -> QuerySet[TaxRate]:
    return TaxRate.objects.all()


def tax_profile_list() -> QuerySet[TaxProfile]:
    return TaxProfile.objects.select_related("tenant").order_by("tenant__slug")


def tax_profile_of(*, tenant) -> TaxProfile | None:
    return TaxProfile.objects.filter(tenant=tenant).first()
