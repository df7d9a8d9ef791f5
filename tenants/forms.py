"""The tenant pages' forms: choosing which tenant to act for, and creating
an API key. A form reads what was typed; api_key_create keeps the rules
on names, scopes and expiry, so the page refuses what the API refuses."""

from __future__ import annotations

from django import forms

from core.forms import UtcDayField


class TenantSwitchForm(forms.Form):
    """The slug of a tenant the user is a member of (checked by the page)."""

    tenant = forms.CharField(required=False, strip=False)


class ApiKeyCreateForm(forms.Form):
    """A key's name, its scopes (checkboxes) and an optional expiry day
    (the key stops working at 00:00 UTC that day)."""

    name = forms.CharField(required=False, strip=False)
    scopes = forms.Field(required=False, widget=forms.CheckboxSelectMultiple)
    expires_at = UtcDayField(required=False)
