"""The webhooks API. A tenant's owners and admins, signed in, manage their
tenant's endpoints, read its deliveries and redeliver; finance staff manage
the operator's endpoints and read and redeliver every delivery. Members set
which events they are emailed about."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_errors import validated
from tenants.api.permissions import IsFinanceOrTenantManager, request_principal, require_tenant
from tenants.models import Tenant
from webhooks.api import serializers as s
from webhooks.selectors import (
    alerts_emailed,
    delivery_get,
    delivery_list,
    endpoint_get,
    endpoint_list,
)
from webhooks.services import (
    alert_opt_out_set,
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_update,
)

TAGS = ["webhooks"]


class IsWebhookManager(IsFinanceOrTenantManager):
    """Finance staff acting for the platform (the operator's endpoints), or
    a tenant's owner or admin signed in (their tenant's: finance staff
    acting for a tenant they belong to manage its webhooks as its member).
    No API key manages webhooks."""

    message = "only finance staff, or a tenant's owners and admins signed in, manage webhooks"

    @staticmethod
    def as_finance(principal) -> bool:
        return principal.for_platform


def managed_tenant(request) -> Tenant | None:
    """Whose: for finance staff None (the operator's endpoints, and every
    delivery), else the member's tenant."""
    principal = request_principal(request)
    if principal.for_platform:
        return None
    return require_tenant(request).tenant


class EndpointListView(APIView):
    permission_classes = [IsWebhookManager]

    @extend_schema(
        summary="Webhook endpoints", responses={200: s.EndpointOut(many=True)}, tags=TAGS
    )
    def get(self, request):
        return Response(
            s.EndpointOut(endpoint_list(tenant=managed_tenant(request)), many=True).data
        )

    @extend_schema(
        summary="Register an endpoint (its signing secret is in the answer)",
        request=s.EndpointIn,
        responses={201: s.EndpointCreatedOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(s.EndpointIn, request.data)
        endpoint = endpoint_create(
            tenant=managed_tenant(request), created_by=request.user, **params
        )
        return Response(s.EndpointCreatedOut(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetailView(APIView):
    permission_classes = [IsWebhookManager]

    @extend_schema(
        summary="One endpoint, with its secret", responses={200: s.EndpointCreatedOut}, tags=TAGS
    )
    def get(self, request, pk: int):
        endpoint = endpoint_get(tenant=managed_tenant(request), pk=pk)
        return Response(s.EndpointCreatedOut(endpoint).data)

    @extend_schema(
        summary="Change an endpoint's URL, events, description or whether it is active",
        request=s.EndpointPatchIn,
        responses={200: s.EndpointOut},
        tags=TAGS,
    )
    def patch(self, request, pk: int):
        params = validated(s.EndpointPatchIn, request.data)
        endpoint = endpoint_get(tenant=managed_tenant(request), pk=pk)
        return Response(s.EndpointOut(endpoint_update(endpoint=endpoint, **params)).data)

    @extend_schema(summary="Remove an endpoint", responses={204: None}, tags=TAGS)
    def delete(self, request, pk: int):
        endpoint_delete(endpoint=endpoint_get(tenant=managed_tenant(request), pk=pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class DeliveryListView(APIView):
    permission_classes = [IsWebhookManager]

    @extend_schema(
        summary="Deliveries, newest first",
        parameters=[s.DeliveryListIn],
        responses={200: s.DeliveryOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        params = validated(s.DeliveryListIn, request.query_params)
        deliveries = delivery_list(
            tenant=managed_tenant(request),
            endpoint_id=params.get("endpoint"),
            status=params.get("status", ""),
        )[: params["limit"]]
        return Response(s.DeliveryOut(deliveries, many=True).data)


class DeliveryDetailView(APIView):
    permission_classes = [IsWebhookManager]

    @extend_schema(
        summary="One delivery with every attempt", responses={200: s.DeliveryDetailOut}, tags=TAGS
    )
    def get(self, request, pk: int):
        return Response(
            s.DeliveryDetailOut(delivery_get(tenant=managed_tenant(request), pk=pk)).data
        )


class RedeliverView(APIView):
    permission_classes = [IsWebhookManager]

    @extend_schema(
        summary="Send a delivery again now (a new round of retries; the same event id)",
        request=None,
        responses={202: s.DeliveryOut},
        tags=TAGS,
    )
    def post(self, request, pk: int):
        delivery = delivery_get(tenant=managed_tenant(request), pk=pk)
        delivery = delivery_redeliver(delivery=delivery, by=request.user.get_username())
        return Response(s.DeliveryOut(delivery).data, status=status.HTTP_202_ACCEPTED)


class AlertsView(APIView):
    """A member's email alerts for the tenant they act for."""

    @extend_schema(
        summary="The events you are emailed about", responses={200: s.AlertsOut}, tags=TAGS
    )
    def get(self, request):
        principal = require_tenant(request)
        if principal.user is None:
            raise PermissionDenied("email alerts belong to a signed-in member")
        return Response({"emailed": alerts_emailed(user=principal.user, tenant=principal.tenant)})

    @extend_schema(
        summary="Choose the events you are emailed about",
        request=s.AlertsIn,
        responses={200: s.AlertsOut},
        tags=TAGS,
    )
    def put(self, request):
        principal = require_tenant(request)
        if principal.user is None:
            raise PermissionDenied("email alerts belong to a signed-in member")
        params = validated(s.AlertsIn, request.data)
        alert_opt_out_set(user=principal.user, tenant=principal.tenant, emailed=params["emailed"])
        return Response({"emailed": alerts_emailed(user=principal.user, tenant=principal.tenant)})
