"""Writes for tenants, memberships, API keys and policies."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, Group, Permission
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, transaction
from django.utils import timezone
from django.utils.text import slugify

from core.calendar import OUT_OF_RANGE, moment_supported
from core.changes import terms_changed
from core.errors import InputError
from core.plain_decimal import plain_decimal
from tenants.choices import (
    FINANCE_GROUP,
    FINANCE_PERMISSION,
    Role,
    Scope,
    ServiceScope,
    TenantStatus,
    Tier,
)
from tenants.errors import AuthenticationError, LastOwnerError, TenantSuspendedError
from tenants.keys import (
    SERVICE_KEY_PREFIX,
    key_generate,
    key_hash,
    key_hash_matches,
    key_parse,
)
from tenants.models import ApiKey, Membership, ServiceKey, Tenant, TenantPolicy

API_KEY_NAME_MAX = ApiKey._meta.get_field("name").max_length
# An expiry is a promise to rotate: at most a year ahead, as GitHub's
# fine-grained tokens, GitLab's and Supabase's access tokens allow; a key
# meant to live longer is made without one (and revoked when done with).
API_KEY_EXPIRY_MAX = timedelta(days=366)
API_KEY_EXPIRY_TOO_LATE = (
    f"must be at most {API_KEY_EXPIRY_MAX.days} days ahead "
    "(leave it empty for a key that does not expire)"
)
# Compared against when no key has the presented prefix, so that an unknown
# prefix costs the same HMAC as a known one.
_DUMMY_HASH = "0" * 64


@transaction.atomic
def tenant_create(
    *,
    name: str,
    tier: str = Tier.SHARED,
    slug: str | None = None,
    billing_currency: str = "USD",
    policy: Mapping[str, Any] | None = None,
) -> Tenant:
    """A tenant with its policy (defaults unless given)."""
    tenant = Tenant(
        name=name.strip(),
        slug=slug or slugify(name),
        tier=tier,
        billing_currency=billing_currency.upper(),
    )
    tenant.full_clean()
    tenant.save()
    tenant_policy = TenantPolicy(tenant=tenant, **(policy or {}))
    tenant_policy.full_clean()
    tenant_policy.save()
    return tenant


def tenant_set_status(*, tenant: Tenant, status: str) -> Tenant:
    if status not in TenantStatus.values:
        raise ValidationError({"status": [f"must be one of {', '.join(TenantStatus.values)}"]})
    tenant.status = status
    tenant.save(update_fields=["status"])
    return tenant


@transaction.atomic
def membership_set(*, tenant: Tenant, user: AbstractBaseUser, role: str) -> Membership:
    """Add `user` to `tenant` with `role`, or change the role they have."""
    if role not in Role.values:
        raise ValidationError({"role": [f"must be one of {', '.join(Role.values)}"]})
    membership = Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    if membership is None:
        return Membership.objects.create(tenant=tenant, user=user, role=role)
    if membership.role == Role.OWNER and role != Role.OWNER:
        _ensure_other_owner(tenant=tenant, user=user)
    membership.role = role
    membership.save(update_fields=["role"])
    return membership


@transaction.atomic
def membership_remove(*, tenant: Tenant, user: AbstractBaseUser) -> None:
    membership = Membership.objects.select_for_update().filter(tenant=tenant, user=user).first()
    if membership is None:
        return
    if membership.role == Role.OWNER:
        _ensure_other_owner(tenant=tenant, user=user)
    membership.delete()


@transaction.atomic
def user_access_sync(
    *, user: AbstractBaseUser, finance: bool, roles: Mapping[Tenant, str]
) -> list[str]:
    """Make `user`'s standing what their identity provider says, on every
    single sign-on: finance staff or not, and a membership with its role in
    exactly the tenants of `roles` (others are removed). A tenant's last
    owner stays its owner; what was kept is returned, for the log."""
    kept = []
    finance_group = Group.objects.get(name=FINANCE_GROUP)
    if finance:
        user.groups.add(finance_group)
    else:
        # Every finance grant goes, not only the group's: a finance_staff
        # permission granted directly, or through another group, survived
        # the provider saying "not finance" (issue 60, finding 6).
        app, codename = FINANCE_PERMISSION.split(".")
        permission = Permission.objects.get(content_type__app_label=app, codename=codename)
        user.user_permissions.remove(permission)
        user.groups.remove(*Group.objects.filter(permissions=permission))
        if user.is_superuser:
            kept.append("kept as a superuser (finance standing through it): an operator's")
    for tenant, role in roles.items():
        try:
            membership_set(tenant=tenant, user=user, role=role)
        except LastOwnerError:
            kept.append(f"kept as the last owner of {tenant.slug} (the provider says {role})")
    for membership in Membership.objects.filter(user=user).exclude(tenant__in=list(roles)):
        try:
            membership_remove(tenant=membership.tenant, user=user)
        except LastOwnerError:
            kept.append(f"kept as the last owner of {membership.tenant.slug} (not named)")
    return kept


def _ensure_other_owner(*, tenant: Tenant, user: AbstractBaseUser) -> None:
    others = (
        Membership.objects.select_for_update()
        .filter(tenant=tenant, role=Role.OWNER)
        .exclude(user=user)
    )
    if not others.exists():
        raise LastOwnerError(f"{tenant} must keep at least one owner")


def api_key_create(
    *,
    tenant: Tenant,
    name: str,
    scopes: Iterable[str],
    expires_at: datetime | None = None,
    created_by: AbstractBaseUser | None = None,
) -> tuple[ApiKey, str]:
    """A new key for `tenant`. Returns the row and the secret, which is not
    stored and cannot be shown again."""
    name = (name or "").strip()
    scope_list = sorted(set(scopes or []))
    if not name:
        raise ValidationError({"name": ["must not be empty"]})
    if len(name) > API_KEY_NAME_MAX:
        raise ValidationError({"name": [f"must be at most {API_KEY_NAME_MAX} characters"]})
    if not scope_list:
        raise ValidationError({"scopes": ["at least one scope is required"]})
    unknown = [s for s in scope_list if s not in Scope.values]
    if unknown:
        raise ValidationError(
            {"scopes": [f"unknown scope {unknown[0]!r}; known: {', '.join(Scope.values)}"]}
        )
    if Scope.AUDIT_READ in scope_list and created_by is not None:
        is_owner = Membership.objects.filter(tenant=tenant, user=created_by, role=Role.OWNER)
        if not is_owner.exists():
            raise ValidationError(
                {"scopes": [f"only the tenant's owners may grant {Scope.AUDIT_READ.value!r}"]}
            )
    if expires_at is not None:
        api_key_expiry_check(expires_at=expires_at)

    for _attempt in range(3):  # a prefix collision is astronomically rare; retry anyway
        prefix, raw = key_generate()
        try:
            with transaction.atomic():
                key = ApiKey.objects.create(
                    tenant=tenant,
                    name=name,
                    prefix=prefix,
                    secret_hash=key_hash(raw),
                    scopes=scope_list,
                    expires_at=expires_at,
                    created_by=created_by,
                )
            return key, raw
        except IntegrityError:
            continue
    raise RuntimeError("could not allocate a unique API key prefix")


def api_key_expiry_check(*, expires_at: datetime, now: datetime | None = None) -> None:
    """A key's expiry: an aware moment within the supported span, in the
    future and at most API_KEY_EXPIRY_MAX ahead (else ValidationError
    naming expires_at). The key page and the API both come through here."""
    now = now or timezone.now()
    if timezone.is_naive(expires_at):
        raise ValidationError({"expires_at": ["must include a timezone"]})
    if not moment_supported(expires_at):
        raise ValidationError({"expires_at": [OUT_OF_RANGE]})
    if expires_at <= now:
        raise ValidationError({"expires_at": ["must be in the future"]})
    if expires_at > now + API_KEY_EXPIRY_MAX:
        raise ValidationError({"expires_at": [API_KEY_EXPIRY_TOO_LATE]})


def api_key_revoke(
    *, tenant: Tenant, key_id: int, revoked_by: AbstractBaseUser | None = None
) -> ApiKey:
    """Revoke one of `tenant`'s keys. Revoking twice keeps the first time.
    Another tenant's key id raises ApiKey.DoesNotExist, like an unknown one."""
    with transaction.atomic():
        key = ApiKey.objects.select_for_update().get(tenant=tenant, pk=key_id)
        if key.revoked_at is None:
            key.revoked_at = timezone.now()
            key.revoked_by = revoked_by
            key.save(update_fields=["revoked_at", "revoked_by"])
    return key


def api_key_authenticate(*, raw_key: str, now: datetime | None = None) -> ApiKey:
    """The live key for `raw_key`, with its tenant loaded.

    Raises AuthenticationError (malformed, unknown, revoked, expired) or
    TenantSuspendedError. The secret is compared in constant time."""
    parsed = key_parse(raw_key or "")
    if parsed is None:
        raise AuthenticationError("malformed API key")
    key = ApiKey.objects.select_related("tenant").filter(prefix=parsed.prefix).first()
    if not key_hash_matches(parsed.raw, key.secret_hash if key else _DUMMY_HASH) or key is None:
        raise AuthenticationError("invalid API key")
    now = now or timezone.now()
    if key.revoked_at is not None:
        raise AuthenticationError("API key has been revoked")
    if key.expires_at is not None and key.expires_at <= now:
        raise AuthenticationError("API key has expired")
    if key.tenant.status != TenantStatus.ACTIVE:
        raise TenantSuspendedError(f"tenant {key.tenant.slug} is suspended")
    return key


def service_key_create(
    *, name: str, scopes: Iterable[str] = (ServiceScope.USAGE_WRITE,), created_by=None
) -> tuple[ServiceKey, str]:
    """A new platform service key. Returns the row and the secret (not stored)."""
    name = (name or "").strip()
    scope_list = sorted(set(scopes))
    if not name:
        raise ValidationError({"name": ["must not be empty"]})
    unknown = [s for s in scope_list if s not in ServiceScope.values]
    if not scope_list or unknown:
        raise ValidationError({"scopes": [f"known: {', '.join(ServiceScope.values)}"]})
    prefix, raw = key_generate(SERVICE_KEY_PREFIX)
    key = ServiceKey.objects.create(
        name=name,
        prefix=prefix,
        secret_hash=key_hash(raw),
        scopes=scope_list,
        created_by=created_by,
    )
    return key, raw


def service_key_authenticate(*, raw_key: str) -> ServiceKey:
    """The live service key for `raw_key`; AuthenticationError otherwise."""
    parsed = key_parse(raw_key or "", SERVICE_KEY_PREFIX)
    if parsed is None:
        raise AuthenticationError("malformed service key")
    key = ServiceKey.objects.filter(prefix=parsed.prefix).first()
    if not key_hash_matches(parsed.raw, key.secret_hash if key else _DUMMY_HASH) or key is None:
        raise AuthenticationError("invalid service key")
    if key.revoked_at is not None:
        raise AuthenticationError("service key has been revoked")
    return key


def service_key_revoke(*, key: ServiceKey) -> ServiceKey:
    if key.revoked_at is None:
        key.revoked_at = timezone.now()
        key.save(update_fields=["revoked_at"])
    return key


def api_keys_mark_used(*, used_at_by_key: Mapping[int, datetime]) -> int:
    """Record when keys were last used; never moves a timestamp backwards.
    Callers batch these (each gateway worker every ten seconds) so the
    request path does not write a row per request; one statement however
    many keys were used (thousands of tenants)."""
    if not used_at_by_key:
        return 0
    ids, stamps = zip(*sorted(used_at_by_key.items()), strict=True)
    table = ApiKey._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE {table} AS k SET last_used_at = u.used_at
            FROM unnest(%s::bigint[], %s::timestamptz[]) AS u (id, used_at)
            WHERE k.id = u.id AND (k.last_used_at IS NULL OR k.last_used_at < u.used_at)
            """,  # noqa: S608 (the table's own name)
            [list(ids), list(stamps)],
        )
        return cursor.rowcount


def policy_budget_block(*, tenant: Tenant, message: str) -> bool:
    """Refuse the tenant's new requests at the gateway, saying why. True
    when this call changed something."""
    changed = bool(
        TenantPolicy.objects.filter(tenant=tenant)
        .exclude(budget_blocked_at__isnull=False, budget_block_message=message)
        .update(budget_blocked_at=timezone.now(), budget_block_message=message)
    )
    if changed:
        terms_changed(tenant.pk)
    return changed


def policy_budget_unblock(*, tenant: Tenant) -> bool:
    changed = bool(
        TenantPolicy.objects.filter(tenant=tenant, budget_blocked_at__isnull=False).update(
            budget_blocked_at=None, budget_block_message=""
        )
    )
    if changed:
        terms_changed(tenant.pk)
    return changed


def budget_parse(value: str | Decimal, *, currency: str) -> Decimal:
    """A monthly budget as typed or read (API, admin), in the tenant's
    billing currency: a plain decimal of no more places than the
    currency's minor units (1.5 JPY is refused), 0 or more, or an
    InputError naming monthly_budget."""
    stored = TenantPolicy._meta.get_field("monthly_budget")
    return plain_decimal(
        value,
        field="monthly_budget",
        places=stored.decimal_places,
        max_digits=stored.max_digits,
        currency=currency,
    )


def policy_budget_set(
    *,
    tenant: Tenant,
    monthly_budget: Decimal | None,
    soft_percent: int | None = None,
    hard_percent: int | None = None,
) -> TenantPolicy:
    """Set (or, with None, remove) the tenant's monthly budget and its
    thresholds. The gateway holds the new hard limit from the next request
    (gateway.terms_signals tells it as this commits)."""
    policy = tenant.policy
    if monthly_budget is not None:
        monthly_budget = budget_parse(monthly_budget, currency=tenant.billing_currency)
    soft = policy.budget_soft_percent if soft_percent is None else soft_percent
    hard = policy.budget_hard_percent if hard_percent is None else hard_percent
    if not 0 < soft <= 1000:
        raise InputError("budget_soft_percent", "must be between 1 and 1000")
    if not 0 < hard <= 1000:
        raise InputError("budget_hard_percent", "must be between 1 and 1000")
    if soft > hard:
        raise InputError(
            "budget_soft_percent", f"the soft threshold ({soft}%) passes the hard one ({hard}%)"
        )
    policy.monthly_budget, policy.budget_soft_percent, policy.budget_hard_percent = (
        monthly_budget,
        soft,
        hard,
    )
    policy.save(
        update_fields=["monthly_budget", "budget_soft_percent", "budget_hard_percent", "updated_at"]
    )
    return policy
