"""Reads of webhooks. A tenant's reads take `tenant=`; None is the
operator's own endpoints, and every delivery (finance staff code paths)."""

from __future__ import annotations

from django.db.models import QuerySet

from tenants.models import Tenant
from webhooks.choices import TENANT_EVENTS
from webhooks.models import AlertOptOut, Delivery, Endpoint


def endpoint_list(*, tenant: Tenant | None) -> QuerySet[Endpoint]:
    """A tenant's endpoints, or (None) the operator's."""
    return Endpoint.objects.filter(tenant=tenant).order_by("pk")


def endpoint_get(*, tenant: Tenant | None, pk: int) -> Endpoint:
    """One endpoint of the tenant's (or the operator's): DoesNotExist otherwise."""
    return Endpoint.objects.get(tenant=tenant, pk=pk)


def delivery_list(
    *, tenant: Tenant | None, endpoint_id: int | None = None, status: str = ""
) -> QuerySet[Delivery]:
    """Newest first: the tenant's endpoints' deliveries, or (None) every one."""
    deliveries = Delivery.objects.select_related("event", "endpoint", "endpoint__tenant")
    if tenant is not None:
        deliveries = deliveries.filter(endpoint__tenant=tenant)
    if endpoint_id is not None:
        deliveries = deliveries.filter(endpoint_id=endpoint_id)
    if status:
        deliveries = deliveries.filter(status=status)
    return deliveries.order_by("-created_at", "-pk")


def delivery_get(*, tenant: Tenant | None, pk: int) -> Delivery:
    """One delivery with its attempts, the tenant's only (None: any)."""
    return delivery_list(tenant=tenant).prefetch_related("log").get(pk=pk)


def alerts_emailed(*, user, tenant: Tenant) -> list[str]:
    """The tenant events `user` is emailed about (all but those opted out)."""
    out = set(
        AlertOptOut.objects.filter(user=user, tenant=tenant).values_list("event_type", flat=True)
    )
    return [str(t) for t in TENANT_EVENTS if t not in out]
