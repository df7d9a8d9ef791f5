"""Each tenant's customer in Stripe: created once, on the tenant's first
invoice pushed to Stripe, and forgotten when Stripe reports it deleted."""

from __future__ import annotations

from billing.models import StripeCustomer
from billing.payments import stripe_api
from tenants.choices import Role
from tenants.models import Membership, Tenant


def stripe_customer_get_or_create(*, tenant: Tenant) -> str:
    """The tenant's Stripe customer id, the customer created (once) when it
    has none. The creation is keyed by the tenant id, so a sync that dies
    after Stripe created the customer and before the row was saved gets the
    same customer back on the re-run; two syncs racing here get the same
    id from Stripe and save one row."""
    known = (
        StripeCustomer.objects.filter(tenant=tenant)
        .values_list("stripe_customer_id", flat=True)
        .first()
    )
    if known:
        return known
    owner = (
        Membership.objects.filter(tenant=tenant, role=Role.OWNER)
        .select_related("user")
        .order_by("pk")
        .first()
    )
    customer = stripe_api.customer_create(
        tenant_id=tenant.pk, name=tenant.name, email=owner.user.email if owner else None
    )
    row, _ = StripeCustomer.objects.get_or_create(
        tenant=tenant, defaults={"stripe_customer_id": customer}
    )
    return row.stripe_customer_id


def stripe_customer_unlink(*, stripe_customer_id: str) -> int:
    """Forget a customer Stripe deleted; the tenant gets a new one on its
    next sync. Returns how many tenants it was linked to (0 or 1)."""
    unlinked, _ = StripeCustomer.objects.filter(stripe_customer_id=stripe_customer_id).delete()
    return unlinked
