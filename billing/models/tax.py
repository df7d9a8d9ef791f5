"""Tax: each tenant's tax profile (where it is, its VAT/GST id, whether
it is exempt) and the rates finance maintains per jurisdiction, dated. An
invoice's tax is decided from these once, when it is rated
(billing.tax.rules), and kept on the invoice and its lines: a rate or a
profile changed later changes no invoice already issued."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from core.fields import SupportedDateField
from tenants.models import Tenant


class TaxProfile(models.Model):
    """Where a tenant is for tax, and who it is to the tax authorities. No
    profile (or no country): invoices carry no tax, as before tax existed."""

    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="tax_profile")
    country = models.CharField(max_length=2, help_text="ISO 3166-1 alpha-2, e.g. DE")
    tax_id = models.CharField(
        max_length=64, blank=True, default="", help_text="VAT/GST id, e.g. DE123456789"
    )
    exempt = models.BooleanField(default=False)
    exempt_reason = models.CharField(max_length=300, blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(exempt=False) | ~Q(exempt_reason=""), name="taxprofile_exempt_why"
            ),
            models.CheckConstraint(
                condition=Q(country__regex=r"^[A-Z]{2}$"), name="taxprofile_country_code"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant} ({self.country})"


class TaxRate(models.Model):
    """A jurisdiction's rate from a day on: the rate in force on a day is
    the latest that began by then. A rate an issued invoice used is kept
    as it was (PROTECT): a new rate takes over from a later day."""

    country = models.CharField(max_length=2, help_text="ISO 3166-1 alpha-2")
    name = models.CharField(max_length=40, help_text='What invoices call it: "VAT", "GST"')
    percent = models.DecimalField(
        max_digits=7,
        decimal_places=4,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
    )
    valid_from = SupportedDateField()
    stripe_tax_rate_id = models.CharField(max_length=255, blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["country", "-valid_from"]
        constraints = [
            models.UniqueConstraint(fields=["country", "valid_from"], name="taxrate_one_a_day"),
            models.CheckConstraint(
                condition=Q(percent__gte=0) & Q(percent__lte=100), name="taxrate_percent"
            ),
            models.CheckConstraint(
                condition=Q(country__regex=r"^[A-Z]{2}$"), name="taxrate_country_code"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.label} from {self.valid_from:%Y-%m-%d}"

    @property
    def label(self) -> str:
        """ "VAT 20% (FR)": how an invoice names it."""
        return f"{self.name} {self.percent.normalize():f}% ({self.country})"


class TaxDetailsRequest(models.Model):
    """A tenant's own change of its country or VAT/GST id, waiting for
    finance to confirm it (issue 60: a tenant setting its own VAT id was
    reverse-charged at once, checked by pattern only). Until then its
    confirmed TaxProfile (or none) is what invoices use."""

    tenant = models.OneToOneField(
        Tenant, on_delete=models.CASCADE, related_name="tax_details_request"
    )
    country = models.CharField(max_length=2)
    tax_id = models.CharField(max_length=64, blank=True, default="")
    requested_at = models.DateTimeField(auto_now=True)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    def __str__(self) -> str:
        return f"{self.tenant}: {self.country} {self.tax_id} (to confirm)"
