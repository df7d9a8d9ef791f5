"""Who may call what. Views declare permissions; the Principal decides."""

from __future__ import annotations

from rest_framework import exceptions
from rest_framework.permissions import BasePermission

from tenants.access import (
    Principal,
    principal_for_api_key,
    principal_for_service_key,
    principal_for_user,
)
from tenants.models import ApiKey, ServiceKey, Tenant
from tenants.selectors import tenant_for_finance

TENANT_HEADER = "HTTP_X_TENANT"


def request_principal(request) -> Principal:
    """The principal of an authenticated DRF request (cached on it)."""
    cached = getattr(request, "_principal", None)
    if cached is not None:
        return cached
    if isinstance(request.auth, ApiKey):
        principal = principal_for_api_key(request.auth)
    elif isinstance(request.auth, ServiceKey):
        principal = principal_for_service_key(request.auth)
    else:
        slug = request.META.get(TENANT_HEADER) or request.session.get("tenant_slug")
        principal = principal_for_user(request.user, tenant_slug=slug)
    request._principal = principal
    return principal


def anonymous(request) -> bool:
    """Nobody signed in and no key: refused (401) before anything else."""
    user = request.user  # None without one (UNAUTHENTICATED_USER)
    return request.auth is None and (user is None or not user.is_authenticated)


def require_tenant(request) -> Principal:
    """The principal, which must act for a tenant."""
    principal = request_principal(request)
    if principal.tenant is None:
        if principal.tenant_choices:
            raise exceptions.ValidationError(
                {"X-Tenant": ["you belong to several tenants: name one in the X-Tenant header"]}
            )
        raise exceptions.NotFound("no tenant is associated with this account", code="no_tenant")
    return principal


def tenant_scope(request, slug: str | None = None) -> Tenant | None:
    """Whose rows the caller may read: its own tenant's (a `slug` naming
    another is not found), or for finance staff any one tenant or, with no
    slug, every tenant (None)."""
    principal = request_principal(request)
    if principal.for_platform:
        return tenant_for_finance(slug=slug) if slug else None
    principal = require_tenant(request)
    if slug and slug != principal.tenant.slug:
        raise exceptions.NotFound(f"no tenant {slug!r}", code="tenant_not_found")
    return principal.tenant


class IsTenantKeyManager(BasePermission):
    """A signed-in owner or admin of the tenant."""

    message = "only a tenant's owners and admins, signed in, may manage API keys"

    def has_permission(self, request, view) -> bool:
        if anonymous(request):
            return False  # 401 before its body is read (issue 60, finding 4)
        principal = request_principal(request)
        if principal.service_key is not None:
            return False
        if principal.api_key is None and principal.tenant is None:
            return True  # let require_tenant answer 404 / 400 with the reason
        return principal.can_manage_keys


class IsFinanceOrTenantManager(BasePermission):
    """Finance staff (whichever tenant they act for), or a tenant's owner or
    admin signed in (for their own tenant). No API key: keys read, people
    change."""

    message = "only finance staff, or a tenant's owners and admins signed in, may change this"

    def has_permission(self, request, view) -> bool:
        if anonymous(request):
            return False  # 401 before its body is read
        principal = request_principal(request)
        if principal.api_key is not None or principal.service_key is not None:
            return False
        if self.as_finance(principal):
            return True
        return principal.tenant is None or principal.can_manage_keys

    @staticmethod
    def as_finance(principal) -> bool:
        return principal.is_finance


class IsFinanceStaff(BasePermission):
    message = "platform finance staff only"

    def has_permission(self, request, view) -> bool:
        return request_principal(request).is_finance


class IsUsageReporter(BasePermission):
    """A platform service key with the usage:write scope."""

    message = "a service key with the 'usage:write' scope is required"

    def has_permission(self, request, view) -> bool:
        principal = request_principal(request)
        return principal.service_key is not None and "usage:write" in principal.scopes


def scope_required(scope: str) -> type[BasePermission]:
    """A permission class: the principal holds `scope`."""

    class HasScope(BasePermission):
        message = f"this credential lacks the {scope!r} scope"

        def has_permission(self, request, view) -> bool:
            principal = request_principal(request)
            return principal.is_finance or scope in principal.scopes

    HasScope.__name__ = f"HasScope[{scope}]"
    return HasScope
