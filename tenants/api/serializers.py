"""Input and output shapes of the tenants API (separate on purpose)."""

from django.utils import timezone
from rest_framework import serializers

from core.api_time import SupportedDateTimeField
from tenants.choices import Scope
from tenants.models import ApiKey, Tenant, TenantPolicy
from tenants.services import API_KEY_EXPIRY_MAX, API_KEY_NAME_MAX


class PolicyOut(serializers.ModelSerializer):
    class Meta:
        model = TenantPolicy
        fields = [
            "priority_class",
            "max_concurrent_requests",
            "requests_per_minute",
            "tokens_per_minute",
            "max_inflight_tokens",
            "monthly_budget",
            "budget_soft_percent",
            "budget_hard_percent",
            "fair_share_weight",
            "queue_timeout_ms",
            "max_queued_requests",
        ]


class TenantOut(serializers.ModelSerializer):
    policy = PolicyOut(
        read_only=True,
        allow_null=True,
        help_text="Null for a tenant that has no policy set.",
    )
    stripe_linked = serializers.SerializerMethodField()

    class Meta:
        model = Tenant
        fields = [
            "id",
            "slug",
            "name",
            "tier",
            "billing_currency",
            "status",
            "stripe_linked",
            "policy",
            "created_at",
        ]

    def get_stripe_linked(self, obj: Tenant) -> bool:
        # Billing keeps the Stripe customer (billing.StripeCustomer, reached
        # by its one-to-one's reverse name, so tenants imports no billing).
        return hasattr(obj, "stripe_customer")


class TenantMeOut(serializers.Serializer):
    tenant = TenantOut()
    role = serializers.CharField(allow_null=True, help_text="Your role, when signed in.")
    scopes = serializers.ListField(child=serializers.CharField())
    api_key = serializers.CharField(
        allow_null=True, help_text="The key used for this call, by its visible prefix."
    )


class ApiKeyOut(serializers.ModelSerializer):
    prefix = serializers.CharField(source="display_prefix")
    created_by = serializers.CharField(source="created_by.username", default=None)
    status = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields = [
            "id",
            "name",
            "prefix",
            "scopes",
            "status",
            "created_by",
            "created_at",
            "last_used_at",
            "expires_at",
            "revoked_at",
        ]

    def get_status(self, obj: ApiKey) -> str:
        if obj.revoked_at is not None:
            return "revoked"
        if obj.expires_at is not None and obj.expires_at <= timezone.now():
            return "expired"
        return "active"


class ApiKeyCreatedOut(ApiKeyOut):
    secret = serializers.CharField(
        help_text="The full key. Shown only in this response; it cannot be retrieved later."
    )

    class Meta(ApiKeyOut.Meta):
        fields = [*ApiKeyOut.Meta.fields, "secret"]


class ApiKeyCreateIn(serializers.Serializer):
    name = serializers.CharField(
        max_length=API_KEY_NAME_MAX,
        # What api_key_create says, so the page and the API read the same.
        error_messages={"max_length": "must be at most {max_length} characters"},
    )
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=Scope.choices), allow_empty=False
    )
    expires_at = SupportedDateTimeField(
        required=False,
        allow_null=True,
        help_text=f"When the key stops working: in the future, at most "
        f"{API_KEY_EXPIRY_MAX.days} days ahead. Null or absent: it does not expire.",
    )
