"""Tax rates and profiles, checked by the tax services."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from billing.errors import (
    BillingInputError,
)
from billing.models import (
    TaxProfile,
    TaxRate,
)
from billing.tax.services import tax_profile_checked, tax_rate_checked
from core.plain_decimal import PLAIN_DECIMALS


class _CheckedForm(forms.ModelForm):
    """A form whose fields a tax service checks: its error lands on the
    field it names, and the cleaned values are the service's."""

    check: staticmethod  # the service's check: its fields -> the cleaned values
    checked: tuple[str, ...] = ()  # the fields the check takes

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            try:
                cleaned.update(self.check(**{f: cleaned.get(f) for f in self.checked}))
            except BillingInputError as error:
                self.add_error(error.field if error.field in self.fields else None, error.message)
        return cleaned


class TaxRateForm(_CheckedForm):
    check = staticmethod(tax_rate_checked)
    checked = ("country", "name", "percent", "valid_from")

    class Meta:
        model = TaxRate
        fields = ["country", "name", "percent", "valid_from"]


class TaxProfileForm(_CheckedForm):
    check = staticmethod(tax_profile_checked)
    checked = ("country", "tax_id", "exempt", "exempt_reason")

    class Meta:
        model = TaxProfile
        fields = ["tenant", "country", "tax_id", "exempt", "exempt_reason"]


@admin.register(TaxRate)
class TaxRateAdmin(admin.ModelAdmin):
    """Dated rates per jurisdiction: a rate is never edited (issued invoices
    name it); a new one takes over from its day."""

    formfield_overrides = PLAIN_DECIMALS
    form = TaxRateForm
    list_display = ["country", "name", "percent", "valid_from", "stripe_tax_rate_id"]
    list_filter = ["country"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TaxProfile)
class TaxProfileAdmin(admin.ModelAdmin):
    form = TaxProfileForm
    list_display = ["tenant", "country", "tax_id", "exempt"]
    search_fields = ["tenant__slug", "tax_id"]
