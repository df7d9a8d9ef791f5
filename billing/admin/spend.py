"""Prepaid credit grants and the budgets' state."""

from __future__ import annotations

from django.contrib import admin

from billing.admin.common import ReadOnlyAdmin
from billing.models import (
    BudgetState,
    CreditGrant,
)
from core.plain_decimal import PLAIN_DECIMALS


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["tenant", "amount", "currency", "granted_at", "expires_at", "priority"]


@admin.register(BudgetState)
class BudgetStateAdmin(ReadOnlyAdmin):
    list_display = [
        "tenant",
        "period_start",
        "spend",
        "budget",
        "soft_notified_at",
        "hard_reached_at",
    ]
