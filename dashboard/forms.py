"""The pages' forms: starting an allocation or invoice run, acting on an
invoice (its SLA credits too), the pages' filters, choosing which tenant
to act for, and creating an API key. A form reads and checks what was
typed; the services keep their own rules (a reason to finalize early, a
credit note's limits, api_key_create's on names, scopes and expiry), so a
page says what the API says. A refused form is shown as "field:
message", its first error."""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.core.exceptions import ValidationError

from billing.choices import (
    INVOICE_TARGET_STATUSES,
    InvoiceStatus,
    SlaAdjustmentAction,
    SloMetric,
)
from billing.costs.runs import allocation_period
from billing.money import minor_parse
from core.errors import InputError
from core.forms import UtcDayField
from core.plain_decimal import PlainDecimalField

CREDIT_NOTE = "credit_note"
RUN_FIELDS = {"start": "first_day", "end": "last_day"}  # a run's fields, as the form names them


def form_error(form: forms.Form) -> str:
    """The first error of a refused form, as "field: message"."""
    field, errors = next(iter(form.errors.items()))
    return f"{field}: {errors[0]}"


class AllocationRunForm(forms.Form):
    """Whole UTC days to allocate: cleaned to `start` (the first day 00:00)
    and `end` (the day after the last day 00:00), cut as every run is
    (billing.costs.runs.allocation_period: at the current hour, hours
    still to come having nothing to allocate yet)."""

    first_day = UtcDayField()
    last_day = UtcDayField()

    def clean(self) -> dict:
        cleaned = super().clean()
        start, last_day = cleaned.get("first_day"), cleaned.get("last_day")
        if start is None or last_day is None:
            return cleaned
        if last_day < start:
            self.add_error("last_day", "must be on or after first_day")
            return cleaned
        try:
            # The days are in the supported span (UtcDayField), so the day
            # after the last one exists.
            cleaned["start"], cleaned["end"] = allocation_period(
                start=start, end=last_day + timedelta(days=1)
            )
        except ValidationError as error:
            for field, problems in error.message_dict.items():
                self.add_error(RUN_FIELDS.get(field, field), problems[0])
        return cleaned


class InvoiceRunForm(forms.Form):
    """Periods that ended by `as_of` (None: now); `drafts` leaves the
    invoices as drafts; `finalize_early` with a `reason` finalizes periods
    that have not ended."""

    as_of = UtcDayField(required=False)
    drafts = forms.BooleanField(required=False)
    finalize_early = forms.BooleanField(required=False)
    reason = forms.CharField(required=False, strip=False)


class InvoiceActionForm(forms.Form):
    """One of finance staff's moves on an invoice: a status it can move to,
    or a credit note of `amount` (typed in the invoice's currency, cleaned
    to minor units) with a `reason`."""

    action = forms.CharField(required=False, strip=False)
    amount = forms.CharField(required=False, strip=False)
    reason = forms.CharField(required=False, strip=False)
    finalize_early = forms.BooleanField(required=False)

    def __init__(self, data, *, currency: str):
        super().__init__(data)
        self.currency = currency

    def clean_action(self) -> str:
        action = self.cleaned_data["action"]
        if action != CREDIT_NOTE and action not in dict(INVOICE_TARGET_STATUSES):
            raise forms.ValidationError(f"unknown action {action!r}")
        return action

    def clean_amount(self) -> int | None:
        if self.cleaned_data.get("action") != CREDIT_NOTE:
            return None
        try:
            return minor_parse(self.cleaned_data["amount"], self.currency, field="amount")
        except InputError as error:
            raise forms.ValidationError(error.message) from None


class SlaCreditForm(forms.Form):
    """Finance's decision on a draft's SLA credit for `metric`: waive it,
    or adjust it to `credit_percent` of the usage charges, with a `reason`
    (the service checks the reason and the percent's range)."""

    metric = forms.ChoiceField(choices=SloMetric.choices)
    action = forms.ChoiceField(choices=SlaAdjustmentAction.choices)
    credit_percent = PlainDecimalField(required=False, max_digits=5, decimal_places=2, min_value=0)
    reason = forms.CharField(required=False, strip=False)


class PeriodFilterForm(forms.Form):
    """`?days=` among a page's periods; missing or unknown is the default."""

    days = forms.TypedChoiceField(required=False, empty_value=None)

    def __init__(self, data, *, periods: dict[str, int], default: int):
        super().__init__(data)
        self.fields["days"].choices = [(key, key) for key in periods]
        self.fields["days"].coerce = periods.__getitem__
        self.default = default

    def days_value(self) -> int:
        if self.is_valid() and self.cleaned_data["days"] is not None:
            return self.cleaned_data["days"]
        return self.default


class InvoiceFilterForm(forms.Form):
    """`?status=`: one status, or every invoice when missing or unknown."""

    status = forms.ChoiceField(required=False, choices=InvoiceStatus.choices)

    def status_value(self) -> str | None:
        return (self.cleaned_data["status"] or None) if self.is_valid() else None


class TenantSwitchForm(forms.Form):
    """The slug of a tenant the user is a member of (checked by the page)."""

    tenant = forms.CharField(required=False, strip=False)


class ApiKeyCreateForm(forms.Form):
    """A key's name, its scopes (checkboxes) and an optional expiry day
    (the key stops working at 00:00 UTC that day)."""

    name = forms.CharField(required=False, strip=False)
    scopes = forms.Field(required=False, widget=forms.CheckboxSelectMultiple)
    expires_at = UtcDayField(required=False)
