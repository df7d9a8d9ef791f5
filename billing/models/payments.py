"""Billing's side of Stripe that is not an invoice: which Stripe customer
each tenant is."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from tenants.models import Tenant


class StripeCustomer(models.Model):
    """The tenant's customer in Stripe. The row exists while the customer
    does: created with the tenant's first invoice pushed to Stripe, removed
    when Stripe reports the customer deleted. PROTECT: the tenant's Stripe
    invoices hang off this customer, and a tenant with a Stripe customer
    has finalized invoices, which are kept for good (immutability)."""

    tenant = models.OneToOneField(Tenant, on_delete=models.PROTECT, related_name="stripe_customer")
    stripe_customer_id = models.CharField(max_length=255, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant__name"]
        constraints = [
            models.CheckConstraint(
                condition=~Q(stripe_customer_id=""), name="stripecustomer_id_not_empty"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.stripe_customer_id}"
