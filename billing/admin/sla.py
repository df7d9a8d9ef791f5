"""Service-level policies, their credit rules, and the credits applied."""

from __future__ import annotations

from django.contrib import admin

from billing.admin.common import ReadOnlyAdmin
from billing.models import (
    SlaCreditAdjustment,
    SlaCreditRule,
    SloPolicy,
)
from core.plain_decimal import PLAIN_DECIMALS


class SlaCreditRuleInline(admin.TabularInline):
    formfield_overrides = PLAIN_DECIMALS
    model = SlaCreditRule
    extra = 0


@admin.register(SloPolicy)
class SloPolicyAdmin(admin.ModelAdmin):
    """A plan's (or a tier's default) SLO targets and SLA credit schedule.
    A change applies to invoices rated from then on (drafts rebuilt
    included); finalized invoices keep what they said."""

    formfield_overrides = PLAIN_DECIMALS
    list_display = [
        "name",
        "plan",
        "tier",
        "availability_percent",
        "ttft_p95_ms",
        "itl_p95_ms",
        "credit_cap_percent",
    ]
    inlines = [SlaCreditRuleInline]


@admin.register(SlaCreditAdjustment)
class SlaCreditAdjustmentAdmin(ReadOnlyAdmin):
    """Finance's decisions on SLA credits, made on the invoice page or the
    API (never edited)."""

    list_display = ["tenant", "period_start", "metric", "action", "credit_percent", "created_by"]
    list_filter = ["metric", "action"]

    def has_delete_permission(self, request, obj=None):
        return False
