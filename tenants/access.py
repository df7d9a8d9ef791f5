"""Who is calling: a tenant's API key, a tenant member signed in, or
platform finance staff. Views and permissions ask the Principal, never the
raw user or key, so the rules live in one place."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser

from tenants.choices import KEY_MANAGER_ROLES, ROLE_SCOPES
from tenants.models import ApiKey, ServiceKey, Tenant
from tenants.selectors import membership_list_for_user, user_is_finance_staff


class ApiKeyUser:
    """Stands in for request.user when a request is made with an API key:
    authenticated, but no Django user and no Django permissions."""

    is_authenticated = True
    is_anonymous = False
    is_active = True
    is_staff = False
    is_superuser = False
    pk = None
    id = None

    def __init__(self, api_key: ApiKey) -> None:
        self.api_key = api_key
        self.username = f"api-key:{api_key.prefix}"

    def has_perm(self, perm: str, obj: object = None) -> bool:
        return False

    def __str__(self) -> str:
        return self.username


class ServiceKeyUser(ApiKeyUser):
    """request.user for a platform service key."""

    def __init__(self, service_key: ServiceKey) -> None:
        self.service_key = service_key
        self.username = f"service-key:{service_key.prefix}"


@dataclass(frozen=True)
class Principal:
    tenant: Tenant | None
    scopes: frozenset[str] = frozenset()
    role: str | None = None
    api_key: ApiKey | None = None
    user: AbstractBaseUser | None = None
    service_key: ServiceKey | None = None
    is_finance: bool = False
    # Set when a member of several tenants did not say which one they mean.
    tenant_choices: tuple[Tenant, ...] = field(default=())

    @property
    def for_platform(self) -> bool:
        """Finance staff acting for no tenant: every tenant's rows, and the
        platform's own settings (the operator's webhooks)."""
        return self.is_finance and self.tenant is None

    @property
    def can_manage_keys(self) -> bool:
        """Owners and admins, signed in. A key cannot mint or revoke keys."""
        return self.api_key is None and self.tenant is not None and self.role in KEY_MANAGER_ROLES


def principal_for_api_key(api_key: ApiKey) -> Principal:
    return Principal(tenant=api_key.tenant, scopes=frozenset(api_key.scopes), api_key=api_key)


def principal_for_service_key(service_key: ServiceKey) -> Principal:
    return Principal(tenant=None, scopes=frozenset(service_key.scopes), service_key=service_key)


def principal_for_user(user: AbstractBaseUser, *, tenant_slug: str | None = None) -> Principal:
    """The tenant a signed-in user acts for: the one named (if they are a
    member), or their only one."""
    is_finance = user_is_finance_staff(user=user)
    memberships = list(membership_list_for_user(user=user))
    if tenant_slug:
        memberships = [m for m in memberships if m.tenant.slug == tenant_slug]
    if len(memberships) == 1:
        m = memberships[0]
        return Principal(
            tenant=m.tenant,
            role=m.role,
            scopes=ROLE_SCOPES[m.role],
            user=user,
            is_finance=is_finance,
        )
    return Principal(
        tenant=None,
        user=user,
        is_finance=is_finance,
        tenant_choices=tuple(m.tenant for m in memberships) if not tenant_slug else (),
    )


def principal_for_session(request) -> Principal | None:
    """The principal behind a signed-in browser session (cached on the
    request). A member of several tenants acts for the one chosen in the
    session, else the first."""
    cached = getattr(request, "_principal", None)
    if cached is not None:
        return cached
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return None
    p = principal_for_user(user, tenant_slug=request.session.get("tenant_slug"))
    if p.tenant is None and p.tenant_choices:
        p = principal_for_user(user, tenant_slug=p.tenant_choices[0].slug)
    request._principal = p
    return p


def finance_staff_required(view):
    """A page for platform finance staff: sign in first, anyone else 403."""
    from functools import wraps

    from django.contrib.auth.decorators import login_required
    from django.core.exceptions import PermissionDenied

    @login_required
    @wraps(view)
    def guarded(request, *args, **kwargs):
        principal = principal_for_session(request)
        if principal is None or not principal.is_finance:
            raise PermissionDenied
        return view(request, *args, **kwargs)

    return guarded
