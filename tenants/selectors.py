"""Reads of tenant data. Every tenant-scoped read takes `tenant=`."""

from __future__ import annotations

from collections.abc import Iterable

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet

from tenants.choices import FINANCE_PERMISSION
from tenants.models import ApiKey, Membership, Tenant, TenantPolicy, TierChange


def api_key_list(*, tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).select_related("created_by")


def membership_list_for_user(*, user: AbstractBaseUser) -> QuerySet[Membership]:
    return Membership.objects.filter(user=user).select_related("tenant", "tenant__policy")


def user_is_member(*, user: AbstractBaseUser, tenant_slug: str) -> bool:
    """Whether `user` is a member of the tenant with this slug."""
    return Membership.objects.filter(user=user, tenant__slug=tenant_slug).exists()


def user_is_finance_staff(*, user: AbstractBaseUser | None) -> bool:
    """Platform finance staff see every tenant; they are not tenant members."""
    return bool(user and user.is_active and user.has_perm(FINANCE_PERMISSION))


def tenant_list_for_finance() -> QuerySet[Tenant]:
    """Every tenant. Only for platform finance staff code paths. With
    billing's Stripe customer row (by its reverse name), shown as linked."""
    return Tenant.objects.select_related("policy", "stripe_customer").order_by("name")


def tenant_for_finance(*, slug: str) -> Tenant:
    """One tenant by slug (Tenant.DoesNotExist if none). Only for platform
    finance staff code paths."""
    return Tenant.objects.get(slug=slug)


def tenant_policy_count() -> int:
    """How many tenants have a policy (every tenant has one). Only for
    platform finance staff code paths."""
    return TenantPolicy.objects.count()


def tenant_list_by_slugs(*, slugs: Iterable[str]) -> list[Tenant]:
    """The tenants with these slugs. Only for single sign-on, which maps an
    identity provider's claims to tenants before anyone is signed in."""
    return list(Tenant.objects.filter(slug__in=list(slugs)).order_by("slug"))


def tier_timelines(tenant_ids) -> dict[int, tuple[tuple, ...]]:
    """Each tenant's tiers as ((since, tier), ...), the first since None:
    only tenants that ever moved (the rest were always in their tier)."""
    out: dict[int, list[tuple]] = {}
    for change in TierChange.objects.filter(tenant_id__in=list(tenant_ids)).order_by(
        "tenant_id", "effective_from", "pk"
    ):
        line = out.setdefault(change.tenant_id, [(None, change.from_tier)])
        line.append((change.effective_from, change.tier))
    return {k: tuple(v) for k, v in out.items()}


def tier_at(timeline: tuple[tuple, ...], moment) -> str:
    """The tier in force at `moment` on a timeline of `tier_timelines`
    (((since, tier), ...), the first since None)."""
    tier = timeline[0][1]
    for since, later in timeline[1:]:
        if since <= moment:
            tier = later
    return tier
