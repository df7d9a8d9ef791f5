"""Dated FX rates."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from billing.models import (
    FxRate,
)
from core.plain_decimal import PLAIN_DECIMALS


class FxRateForm(forms.ModelForm):
    class Meta:
        model = FxRate
        fields = ["base", "quote", "date", "rate", "source"]
        help_texts = {"rate": "Units of quote per one base (EUR/USD 1.08: 1 EUR = 1.08 USD)."}

    def clean_base(self):
        return self.cleaned_data["base"].strip().upper()

    def clean_quote(self):
        return self.cleaned_data["quote"].strip().upper()


@admin.register(FxRate)
class FxRateAdmin(admin.ModelAdmin):
    """Dated FX rates margin reports convert revenue with (billing.fx); a
    file of reference rates goes in with `manage.py fx_rates_import`."""

    formfield_overrides = PLAIN_DECIMALS
    form = FxRateForm
    list_display = ["date", "base", "quote", "rate", "source", "created_by"]
    list_filter = ["base", "quote", "source"]
    date_hierarchy = "date"
    readonly_fields = ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)
