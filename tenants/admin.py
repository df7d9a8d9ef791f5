"""Admin for tenants. API key secrets and hashes are never shown; keys are
created where the secret can be shown once (API, portal, seed_demo)."""

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from core.errors import InputError
from core.plain_decimal import PLAIN_DECIMALS
from tenants.models import ApiKey, Membership, ServiceKey, Tenant, TenantPolicy


class TenantPolicyForm(forms.ModelForm):
    """A policy as the admin edits it: its budget typed as a plain decimal
    (PLAIN_DECIMALS) in the tenant's billing currency, checked as the
    API's (tenants.services.budget_parse): 1.5 JPY is refused."""

    def clean(self):
        from tenants.services import budget_parse

        cleaned = super().clean()
        tenant, budget = cleaned.get("tenant"), cleaned.get("monthly_budget")
        if isinstance(tenant, Tenant) and budget is not None:
            try:
                cleaned["monthly_budget"] = budget_parse(budget, currency=tenant.billing_currency)
            except InputError as error:
                self.add_error("monthly_budget", error.message)
        return cleaned


class TenantPolicyInline(admin.StackedInline):
    model = TenantPolicy
    form = TenantPolicyForm
    formfield_overrides = PLAIN_DECIMALS
    can_delete = False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ["user"]


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "tier", "billing_currency", "status", "created_at"]
    list_filter = ["tier", "status", "billing_currency"]
    search_fields = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [TenantPolicyInline, MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "tenant", "role", "created_at"]
    list_filter = ["role", "tenant__tier"]
    search_fields = ["user__username", "user__email", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["user", "tenant"]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ["display_prefix", "name", "tenant", "scopes", "status", "last_used_at"]
    list_filter = ["tenant__tier", ("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "tenant__name", "tenant__slug"]
    exclude = ["secret_hash"]
    readonly_fields = [
        "tenant",
        "display_prefix",
        "scopes",
        "created_by",
        "created_at",
        "last_used_at",
        "expires_at",
        "revoked_at",
        "revoked_by",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description="status")
    def status(self, obj: ApiKey) -> str:
        if obj.revoked_at:
            return "revoked"
        if obj.expires_at and obj.expires_at <= timezone.now():
            return "expired"
        return "active"

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        from tenants.services import api_key_revoke

        for key in queryset.select_related("tenant"):
            api_key_revoke(tenant=key.tenant, key_id=key.pk, revoked_by=request.user)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)


@admin.register(TenantPolicy)
class TenantPolicyAdmin(admin.ModelAdmin):
    list_display = [
        "tenant",
        "priority_class",
        "max_concurrent_requests",
        "requests_per_minute",
        "tokens_per_minute",
        "fair_share_weight",
        "queue_timeout_ms",
        "max_queued_requests",
        "monthly_budget",
    ]
    list_filter = ["priority_class"]
    search_fields = ["tenant__name", "tenant__slug"]
    form = TenantPolicyForm
    formfield_overrides = PLAIN_DECIMALS


@admin.register(ServiceKey)
class ServiceKeyAdmin(admin.ModelAdmin):
    """Created with `manage.py service_key_create` (the secret is shown once)."""

    list_display = ["display_prefix", "name", "scopes", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix"]
    exclude = ["secret_hash"]
    readonly_fields = [
        "display_prefix",
        "scopes",
        "created_by",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Revoke selected service keys")
    def revoke(self, request, queryset):
        from tenants.services import service_key_revoke

        for key in queryset:
            service_key_revoke(key=key)
        self.message_user(request, f"Revoked {queryset.count()} key(s).", messages.SUCCESS)
