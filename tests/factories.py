"""Factories for test data. Tenants go through the service, as in production."""

from __future__ import annotations

import importlib

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tenants.choices import FINANCE_GROUP, Role, Scope, Tier
from tenants.models import ApiKey, Membership, Tenant
from tenants.services import api_key_create, membership_set, tenant_create

PASSWORD = "correct horse battery staple"


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.test")
    password = factory.PostGenerationMethodCall("set_password", PASSWORD)

    @factory.post_generation
    def save_password(obj, create, extracted, **kwargs):
        if create:
            obj.save()


_tenant_seq = iter(range(1, 10**9))


def make_tenant(*, name: str | None = None, tier: str = Tier.SHARED, **kwargs) -> Tenant:
    # Zero-padded: tenants sort by slug or name in the order they were made,
    # however many tests made tenants before ("tenant-100" < "tenant-99").
    n = next(_tenant_seq)
    return tenant_create(
        name=name or f"Tenant {n:06d}", slug=f"tenant-{n:06d}", tier=tier, **kwargs
    )


def make_member(tenant: Tenant, role: str = Role.OWNER, **user_kwargs) -> Membership:
    user = UserFactory(**user_kwargs)
    return membership_set(tenant=tenant, user=user, role=role)


def make_finance_user(**kwargs):
    if not Group.objects.filter(name=FINANCE_GROUP).exists():
        # A transactional test's flush removed what the data migration made.
        from django.apps import apps

        importlib.import_module("tenants.migrations.0002_finance_group").create_finance_group(
            apps, None
        )
    user = UserFactory(**kwargs)
    user.groups.add(Group.objects.get(name=FINANCE_GROUP))
    return user


def make_key(tenant: Tenant, *, scopes=tuple(Scope.values), **kwargs) -> tuple[ApiKey, str]:
    return api_key_create(
        tenant=tenant, name=kwargs.pop("name", "test key"), scopes=scopes, **kwargs
    )


def make_list_price(
    model,
    *,
    effective_from,
    currency: str = "USD",
    name: str = "list",
    per_mtok=("1", "0.5", "2"),
):
    """A price book in force from `effective_from` pricing `model`'s input,
    cached input and output per million tokens (`per_mtok`, in that order)."""
    from decimal import Decimal

    from billing.models import ModelPrice, PriceBook

    book = PriceBook.objects.create(name=name, currency=currency, effective_from=effective_from)
    prompt, cached, output = (Decimal(str(v)) for v in per_mtok)
    ModelPrice.objects.create(
        book=book,
        served_model=model,
        input_per_mtok=prompt,
        cached_input_per_mtok=cached,
        output_per_mtok=output,
    )
    return book
