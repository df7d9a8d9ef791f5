"""The demo world's tenants, people and keys (used by `seed_demo`).

Idempotent: a second run finds everything in place and changes nothing. Demo
API key secrets go to a git-ignored file readable only by its owner; they
are never printed or logged. A key whose secret is no longer in that file
(file deleted) is revoked and replaced, since it cannot be recovered."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction

from tenants.choices import FINANCE_GROUP, PriorityClass, Role, Scope, Tier
from tenants.errors import AuthenticationError, TenantSuspendedError
from tenants.models import ApiKey, Tenant
from tenants.services import (
    api_key_authenticate,
    api_key_create,
    api_key_revoke,
    membership_set,
    tenant_create,
)

DEMO_KEY_NAME = "demo"
FINANCE_USERNAME = "finance"


@dataclass(frozen=True)
class DemoTenant:
    name: str
    slug: str
    tier: str
    currency: str
    policy: dict


DEMO_TENANTS = [
    DemoTenant(
        "Acme Robotics",
        "acme",
        Tier.DEDICATED,
        "USD",
        {
            "priority_class": PriorityClass.HIGH,
            "max_concurrent_requests": 64,
            "monthly_budget": Decimal("25000"),
        },
    ),
    DemoTenant(
        "Globex Analytics",
        "globex",
        Tier.RESERVED,
        "USD",
        {
            "priority_class": PriorityClass.NORMAL,
            "max_concurrent_requests": 32,
            "requests_per_minute": 6000,
            "tokens_per_minute": 2_000_000,
            "monthly_budget": Decimal("12000"),
        },
    ),
    DemoTenant(
        "Initech Search",
        "initech",
        Tier.RESERVED,
        "EUR",
        {
            "priority_class": PriorityClass.CRITICAL,
            "max_concurrent_requests": 32,
            "requests_per_minute": 3000,
            "monthly_budget": Decimal("8000"),
        },
    ),
    DemoTenant(
        "Hooli Chat",
        "hooli",
        Tier.SHARED,
        "USD",
        {
            "priority_class": PriorityClass.NORMAL,
            "max_concurrent_requests": 16,
            "requests_per_minute": 1200,
            "tokens_per_minute": 400_000,
            "max_inflight_tokens": 64_000,
            "monthly_budget": Decimal("2500"),
        },
    ),
    DemoTenant(
        "Umbrella Health",
        "umbrella",
        Tier.SHARED,
        "EUR",
        {
            "priority_class": PriorityClass.HIGH,
            "max_concurrent_requests": 8,
            "requests_per_minute": 600,
            "tokens_per_minute": 200_000,
            "monthly_budget": Decimal("1500"),
        },
    ),
    DemoTenant(
        "Stark Batch Labs",
        "stark",
        Tier.SHARED,
        "USD",
        {
            "priority_class": PriorityClass.BATCH,
            "max_concurrent_requests": 24,
            "tokens_per_minute": 1_000_000,
            "max_inflight_tokens": 256_000,
            "monthly_budget": Decimal("4000"),
        },
    ),
]


@dataclass
class SeedReport:
    tenants_created: int = 0
    users_created: int = 0
    keys_created: int = 0
    keys_replaced: int = 0


def demo_seed(*, secrets_path: Path, password: str) -> SeedReport:
    report = SeedReport()
    secrets = _secrets_read(secrets_path)
    with transaction.atomic():
        finance, created = _user_ensure(FINANCE_USERNAME, password, "Fran", "Finance")
        report.users_created += created
        finance.groups.add(Group.objects.get(name=FINANCE_GROUP))
        for spec in DEMO_TENANTS:
            tenant = Tenant.objects.filter(slug=spec.slug).first()
            if tenant is None:
                tenant = tenant_create(
                    name=spec.name,
                    slug=spec.slug,
                    tier=spec.tier,
                    billing_currency=spec.currency,
                    policy=spec.policy,
                )
                report.tenants_created += 1
            for role in (Role.OWNER, Role.VIEWER):
                user, created = _user_ensure(
                    f"{spec.slug}-{role}", password, spec.name.split()[0], role.label
                )
                report.users_created += created
                if not tenant.memberships.filter(user=user, role=role).exists():
                    membership_set(tenant=tenant, user=user, role=role)
            secret = _demo_key_ensure(tenant, secrets.get(spec.slug), report)
            secrets[spec.slug] = secret
    _secrets_write(secrets_path, secrets)
    return report


def _user_ensure(username: str, password: str, first: str, last: str):
    user_model = get_user_model()
    user = user_model.objects.filter(username=username).first()
    if user is not None:
        return user, False
    user = user_model.objects.create_user(
        username=username,
        password=password,
        first_name=first,
        last_name=last,
        email=f"{username}@demo.invalid",
    )
    return user, True


def _demo_key_ensure(tenant: Tenant, known_secret: str | None, report: SeedReport) -> str:
    live = ApiKey.objects.filter(tenant=tenant, name=DEMO_KEY_NAME, revoked_at__isnull=True)
    if known_secret:
        try:
            key = api_key_authenticate(raw_key=known_secret)
            if key.tenant_id == tenant.pk and key.name == DEMO_KEY_NAME:
                return known_secret
        except (AuthenticationError, TenantSuspendedError):
            pass  # lost or revoked: replaced below
    for stale in live:
        api_key_revoke(tenant=tenant, key_id=stale.pk)
        report.keys_replaced += 1
    _key, secret = api_key_create(tenant=tenant, name=DEMO_KEY_NAME, scopes=Scope.values)
    report.keys_created += 1
    return secret


def _secrets_read(path: Path) -> dict[str, str]:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def _secrets_write(path: Path, secrets: dict[str, str]) -> None:
    """Atomically, created with mode 600 (never world-readable, even briefly)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".demo-keys-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(secrets, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
