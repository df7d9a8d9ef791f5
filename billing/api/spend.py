"""Spend control over the API. Finance staff grant prepaid
credit (POST /credit-grants) and set budgets (PUT /tenants/{slug}/budget);
the gateway holds the change from the next request. Tenants (an API key
with `billing:read`, or a member's session) and finance staff read where a
tenant stands (GET /spend): each account it is held to, its limit, spent,
reserved by requests in flight, and what is left."""

from __future__ import annotations

from decimal import Decimal

from django.core.exceptions import ObjectDoesNotExist
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.spend.balances import spend_standing
from billing.spend.budgets import budget_set
from billing.spend.wallet import credit_grant_create
from core.api_decimal import PlainDecimalField
from core.api_errors import validated
from core.api_query import QueryIn
from core.api_time import SupportedDateTimeField
from core.errors import InputError
from tenants.api.permissions import IsFinanceStaff, scope_required, tenant_scope
from tenants.api.serializers import PolicyOut
from tenants.selectors import tenant_for_finance

TAGS = ["spend"]
MONEY = {"max_digits": 20, "decimal_places": 4}


class CreditGrantIn(serializers.Serializer):
    tenant = serializers.SlugField()
    amount = PlainDecimalField(**MONEY, min_value=Decimal("0.0001"))
    currency = serializers.RegexField(
        r"^[A-Za-z]{3}$",
        required=False,
        help_text="ISO 4217; the tenant's billing currency if absent.",
    )
    expires_at = SupportedDateTimeField(required=False, allow_null=True)
    priority = serializers.IntegerField(min_value=0, max_value=32767, default=0)
    note = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)


class CreditGrantOut(serializers.Serializer):
    id = serializers.IntegerField()
    tenant = serializers.CharField(source="tenant.slug")
    amount = serializers.DecimalField(**MONEY)
    currency = serializers.CharField()
    granted_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(allow_null=True)
    priority = serializers.IntegerField()
    note = serializers.CharField()


class BudgetIn(serializers.Serializer):
    monthly_budget = PlainDecimalField(
        **MONEY, min_value=Decimal(0), allow_null=True, help_text="null removes the budget."
    )
    budget_soft_percent = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    budget_hard_percent = serializers.IntegerField(min_value=1, max_value=1000, required=False)


class StandingQueryIn(QueryIn):
    tenant = serializers.SlugField(
        required=False, help_text="Finance staff: the tenant. Tenants: only their own slug."
    )


class StandingOut(serializers.Serializer):
    kind = serializers.CharField(help_text="budget | prepaid")
    currency = serializers.CharField()
    limit = serializers.DecimalField(max_digits=28, decimal_places=9)
    spent = serializers.DecimalField(max_digits=28, decimal_places=9)
    reserved = serializers.DecimalField(max_digits=28, decimal_places=9, allow_null=True)
    left = serializers.DecimalField(max_digits=28, decimal_places=9)
    live = serializers.BooleanField(help_text="spent is the gateway's count (else the ledger's)")


class CreditGrantCreateView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Grant prepaid credit to a tenant (it applies at the gateway at once)",
        request=CreditGrantIn,
        responses={201: CreditGrantOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(CreditGrantIn, request.data)
        try:
            tenant = tenant_for_finance(slug=params.pop("tenant"))
        except ObjectDoesNotExist:
            raise InputError("tenant", "no tenant has this slug") from None
        grant = credit_grant_create(
            tenant=tenant,
            note=params.pop("note") or f"granted by {request.user.get_username()}",
            **params,
        )
        return Response(CreditGrantOut(grant).data, status=status.HTTP_201_CREATED)


class BudgetView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Set or remove a tenant's monthly budget (held at the gateway at once)",
        request=BudgetIn,
        responses={200: PolicyOut},
        tags=TAGS,
    )
    def put(self, request, slug: str):
        params = validated(BudgetIn, request.data)
        policy = budget_set(
            tenant=tenant_for_finance(slug=slug),
            monthly_budget=params["monthly_budget"],
            soft_percent=params.get("budget_soft_percent"),
            hard_percent=params.get("budget_hard_percent"),
        )
        return Response(PolicyOut(policy).data)


class StandingView(APIView):
    permission_classes = [scope_required("billing:read")]

    @extend_schema(
        summary="Where the tenant stands against its budget and prepaid balance",
        parameters=[StandingQueryIn],
        responses={200: StandingOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        params = validated(StandingQueryIn, request.query_params)
        tenant = tenant_scope(request, params.get("tenant"))
        if tenant is None:
            raise exceptions.ValidationError({"tenant": ["finance staff: name one tenant"]})
        standing = spend_standing(tenant=tenant, now=timezone.now())
        return Response(StandingOut(standing, many=True).data)
