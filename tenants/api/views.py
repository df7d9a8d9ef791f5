"""Tenant and API key endpoints. Views parse, authorise and call services."""

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_errors import validated
from tenants.api.permissions import (
    IsFinanceStaff,
    IsTenantKeyManager,
    require_tenant,
)
from tenants.api.serializers import (
    ApiKeyCreatedOut,
    ApiKeyCreateIn,
    ApiKeyOut,
    TenantMeOut,
    TenantOut,
)
from tenants.selectors import api_key_list, tenant_list_for_finance
from tenants.services import api_key_create, api_key_revoke


class TenantMeView(APIView):
    @extend_schema(
        summary="The tenant this credential acts for",
        responses={200: TenantMeOut},
        tags=["tenants"],
    )
    def get(self, request):
        principal = require_tenant(request)
        body = {
            "tenant": principal.tenant,
            "role": principal.role,
            "scopes": sorted(principal.scopes),
            "api_key": principal.api_key.display_prefix if principal.api_key else None,
        }
        return Response(TenantMeOut(body).data)


class TenantListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Every tenant (platform finance staff)",
        responses={200: TenantOut(many=True)},
        tags=["tenants"],
    )
    def get(self, request):
        return Response(TenantOut(tenant_list_for_finance(), many=True).data)


class ApiKeyListCreateView(APIView):
    permission_classes = [IsTenantKeyManager]

    @extend_schema(
        summary="Your tenant's API keys (secrets are never listed)",
        responses={200: ApiKeyOut(many=True)},
        tags=["api-keys"],
    )
    def get(self, request):
        principal = require_tenant(request)
        return Response(ApiKeyOut(api_key_list(tenant=principal.tenant), many=True).data)

    @extend_schema(
        summary="Create an API key; the secret is in this response only",
        request=ApiKeyCreateIn,
        responses={201: ApiKeyCreatedOut},
        tags=["api-keys"],
    )
    def post(self, request):
        principal = require_tenant(request)
        data = validated(ApiKeyCreateIn, request.data)
        key, secret = api_key_create(tenant=principal.tenant, created_by=principal.user, **data)
        key.secret = secret
        return Response(ApiKeyCreatedOut(key).data, status=status.HTTP_201_CREATED)


class ApiKeyRevokeView(APIView):
    permission_classes = [IsTenantKeyManager]

    @extend_schema(
        summary="Revoke an API key (it stops working at once; revoking twice is harmless)",
        request=None,
        responses={200: ApiKeyOut},
        tags=["api-keys"],
    )
    def post(self, request, key_id: int):
        principal = require_tenant(request)
        key = api_key_revoke(tenant=principal.tenant, key_id=key_id, revoked_by=principal.user)
        return Response(ApiKeyOut(key).data)
