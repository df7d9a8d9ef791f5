"""Stripe customers and the events received from Stripe."""

from __future__ import annotations

from django.contrib import admin

from billing.admin.common import ReadOnlyAdmin
from billing.models import (
    StripeCustomer,
    StripeEvent,
)


@admin.register(StripeCustomer)
class StripeCustomerAdmin(admin.ModelAdmin):
    """Each tenant's customer in Stripe (created by the first invoice sync)."""

    list_display = ["tenant", "stripe_customer_id", "created_at"]
    search_fields = ["stripe_customer_id", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    readonly_fields = ["created_at"]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "created", "processed_at", "outcome"]
    search_fields = ["event_id", "type"]
