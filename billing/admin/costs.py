"""Costs: rates written through the rate service (overlaps refused, a
change closes the rate it replaces, a rate in effect read-only), cost
periods reopened on the record, runs and results read-only."""

from __future__ import annotations

import copy

from django import forms
from django.contrib import admin
from django.forms.models import construct_instance
from django.utils import timezone

from billing.admin.common import ReadOnlyAdmin
from billing.costs.closing import cost_period_reopen, cost_period_reopen_check
from billing.costs.rates import EDITABLE, cost_rate_check, cost_rate_create, cost_rate_update
from billing.errors import (
    BillingInputError,
    CostPeriodClosedError,
)
from billing.models import (
    AllocationRun,
    CostAllocation,
    CostPeriodReopening,
    CostRate,
    CostScenario,
    PoolHourCost,
)
from core.plain_decimal import PLAIN_DECIMALS


class CostRateForm(forms.ModelForm):
    class Meta:
        model = CostRate
        fields = CostRate.INPUT_FIELDS

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            candidate = construct_instance(self, copy.copy(self.instance))
            now = timezone.now() if candidate.pk else None
            try:
                cost_rate_check(candidate, now=now)  # a ValidationError lands on its field
            except CostPeriodClosedError as error:
                self.add_error("effective_from", str(error).removeprefix("effective_from: "))
        return cleaned


class CostPeriodReopeningForm(forms.ModelForm):
    class Meta:
        model = CostPeriodReopening
        fields = ["start", "end", "reason"]

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            try:
                cost_period_reopen_check(**cleaned)
            except BillingInputError as error:
                self.add_error(error.field if error.field in cleaned else None, error.message)
        return cleaned


@admin.register(CostPeriodReopening)
class CostPeriodReopeningAdmin(admin.ModelAdmin):
    """Added with a reason, through the same service as the API; never
    edited after (the record of who reopened what, when and why)."""

    form = CostPeriodReopeningForm
    list_display = ["start", "end", "reason", "reopened_by", "reopened_at"]

    def has_change_permission(self, request, obj=None):
        return obj is None

    def save_model(self, request, obj, form, change):
        obj.pk = cost_period_reopen(**form.cleaned_data, user=request.user).pk


@admin.register(CostRate)
class CostRateAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    form = CostRateForm
    list_display = CostRate.INPUT_FIELDS[:-1]
    list_filter = ["component", "pool", "scenario"]
    date_hierarchy = "effective_from"

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.effective_from <= timezone.now():
            return [f.name for f in CostRate._meta.fields]
        return ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            cost_rate_update(rate=obj, **{k: getattr(obj, k) for k in EDITABLE})
        else:
            obj.pk = cost_rate_create(**form.cleaned_data, user=request.user).pk


@admin.register(CostScenario)
class CostScenarioAdmin(admin.ModelAdmin):
    list_display = ["name", "start", "end", "idle_cost_policy", "created_at"]
    search_fields = ["name"]


@admin.register(AllocationRun)
class AllocationRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "scenario", "start", "end", "status", "progress_percent", "created_at"]
    list_filter = ["status", "scenario"]

    @admin.display(description="progress")
    def progress_percent(self, run: AllocationRun) -> str:
        return f"{run.hours_done}/{run.hours_total} h ({run.progress:.0%})"


@admin.register(PoolHourCost)
class PoolHourCostAdmin(ReadOnlyAdmin):
    list_display = [
        "hour",
        "pool",
        "gpus",
        "busy_seconds",
        "capacity_seconds",
        "total",
        "allocated",
        "unallocated",
        "scenario",
    ]
    list_filter = ["pool", "pool_kind", "scenario"]
    date_hierarchy = "hour"


@admin.register(CostAllocation)
class CostAllocationAdmin(ReadOnlyAdmin):
    list_display = [
        "hour",
        "tenant",
        "pool",
        "served_model",
        "device_seconds",
        "capital",
        "energy",
        "other_opex",
        "idle",
        "total",
        "scenario",
    ]
    list_filter = ["pool_kind", "pool", "scenario"]
    search_fields = ["tenant__slug"]
    date_hierarchy = "hour"
