"""Tax for finance staff: the dated rates per jurisdiction, and each
tenant's tax profile (country, VAT/GST id, exemption). A bad country, tax
id, percent or day is a 400 naming the field, nothing written
(billing.tax.services). A tenant's members read their own profile; its
owners and admins, signed in, set its country and tax id (an exemption is
finance's)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.errors import BillingInputError
from billing.models import TaxDetailsRequest, TaxProfile, TaxRate
from billing.tax.selectors import tax_profile_of, tax_rate_list
from billing.tax.services import (
    tax_details_confirm,
    tax_details_set,
    tax_profile_clear,
    tax_profile_set,
    tax_rate_create,
)
from core.api_errors import validated
from tenants.api.permissions import (
    IsFinanceOrTenantManager,
    IsFinanceStaff,
    request_principal,
    scope_required,
    tenant_scope,
)
from tenants.selectors import tenant_for_finance

TAGS = ["tax"]


class TaxRateOut(serializers.ModelSerializer):
    class Meta:
        model = TaxRate
        fields = ["id", "country", "name", "percent", "valid_from", "label", "created_at"]


class TaxRateIn(serializers.Serializer):
    country = serializers.CharField(help_text="ISO 3166-1 alpha-2, e.g. FR")
    name = serializers.CharField(help_text='What invoices call it: "VAT", "GST"')
    percent = serializers.CharField(help_text='A percent from 0 to 100, e.g. "20" or "8.1"')
    valid_from = serializers.CharField(help_text="The first day it applies (YYYY-MM-DD)")


class TaxProfileOut(serializers.ModelSerializer):
    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = TaxProfile
        fields = ["tenant", "country", "tax_id", "exempt", "exempt_reason", "updated_at"]


class TaxDetailsRequestOut(serializers.ModelSerializer):
    """A tenant's own details, sent and waiting for finance to confirm them."""

    tenant = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    status = serializers.SerializerMethodField()

    class Meta:
        model = TaxDetailsRequest
        fields = ["tenant", "country", "tax_id", "requested_at", "status"]

    def get_status(self, _) -> str:
        return "awaiting_confirmation"


class TaxProfileIn(serializers.Serializer):
    country = serializers.CharField(help_text="ISO 3166-1 alpha-2, e.g. DE")
    tax_id = serializers.CharField(required=False, allow_blank=True, default="")
    exempt = serializers.BooleanField(required=False, default=False)
    exempt_reason = serializers.CharField(required=False, allow_blank=True, default="")
    # The profile as read may be sent back: these are read back, not set
    # (read-only: no unknown fields, and no part of the request's schema).
    tenant = serializers.CharField(read_only=True)
    updated_at = serializers.DateTimeField(read_only=True)


class TaxRateListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Tax rates, by country, newest first",
        responses={200: TaxRateOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        return Response(TaxRateOut(tax_rate_list(), many=True).data)

    @extend_schema(
        summary="A jurisdiction's rate from a day on (a country and day already set: 400)",
        request=TaxRateIn,
        responses={201: TaxRateOut},
        tags=TAGS,
    )
    def post(self, request):
        rate = tax_rate_create(**validated(TaxRateIn, request.data))
        return Response(TaxRateOut(rate).data, status=status.HTTP_201_CREATED)


class TaxProfileView(APIView):
    def get_permissions(self):
        if self.request.method == "GET":
            return [scope_required("billing:read")()]
        if self.request.method == "PUT":
            return [IsFinanceOrTenantManager()]
        return [IsFinanceStaff()]

    @extend_schema(
        summary="The tenant's tax profile (404: none, no tax)",
        responses={200: TaxProfileOut},
        tags=TAGS,
    )
    def get(self, request, slug: str):
        tenant = tenant_scope(request, slug)
        profile = tax_profile_of(tenant=tenant)
        if profile is None:
            raise exceptions.NotFound(f"{slug} has no tax profile: its invoices carry no tax")
        return Response(TaxProfileOut(profile).data)

    @extend_schema(
        summary=(
            "Set the tenant's tax profile (finance staff); a tenant's owners and admins set "
            "their own country and tax id, never an exemption"
        ),
        request=TaxProfileIn,
        responses={200: TaxProfileOut},
        tags=TAGS,
    )
    def put(self, request, slug: str):
        if request_principal(request).is_finance:
            tenant = tenant_for_finance(slug=slug)
            profile = tax_profile_set(tenant=tenant, **validated(TaxProfileIn, request.data))
            return Response(TaxProfileOut(profile).data)
        tenant = tenant_scope(request, slug)
        details = validated(TaxProfileIn, request.data)
        current = tax_profile_of(tenant=tenant)  # an exemption as read back may be sent back
        for field, none in (("exempt", False), ("exempt_reason", "")):
            if field in request.data and details[field] != getattr(current, field, none):
                raise BillingInputError(field, "only finance staff set a tax exemption")
        waiting = tax_details_set(
            tenant=tenant, country=details["country"], tax_id=details["tax_id"], by=request.user
        )
        if waiting is None:  # the confirmed details again: nothing waits
            return Response(TaxProfileOut(current).data)
        # Sent, not applied: finance confirms a tenant's own details first.
        return Response(TaxDetailsRequestOut(waiting).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        summary="Remove the tenant's tax profile (its next invoices carry no tax)",
        responses={204: None},
        tags=TAGS,
    )
    def delete(self, request, slug: str):
        tax_profile_clear(tenant=tenant_for_finance(slug=slug))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TaxDetailsConfirmView(APIView):
    """Finance confirms a tenant's own tax details: they apply from now on."""

    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Confirm the tax details a tenant sent (finance staff)",
        request=None,
        responses={200: TaxProfileOut},
        tags=TAGS,
    )
    def post(self, request, slug: str):
        profile = tax_details_confirm(tenant=tenant_for_finance(slug=slug))
        return Response(TaxProfileOut(profile).data)
