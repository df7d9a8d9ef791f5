from __future__ import annotations

from dataclasses import dataclass

import pytest
from django.db.backends.signals import connection_created
from django.dispatch import receiver
from rest_framework.test import APIClient

from tenants.choices import Role
from tenants.models import Membership, Tenant
from tests.factories import make_key, make_member, make_tenant
from tests.fleet import fleet, gateway, vllm, vllm_embed  # noqa: F401 (fixtures for every test package)
from tests.ledger import ledger, ledger_committed  # noqa: F401 (fixtures for every test package)


@receiver(connection_created)
def _yield_deadlocks_to_servers(sender, connection, **kwargs) -> None:
    """Between transactional tests the suite TRUNCATEs every table while the
    gateways it started still read theirs (a fleet refresh every 0.2 s): the
    two can deadlock. PostgreSQL aborts the side whose check runs first,
    after `deadlock_timeout`; with the suite's own connection waiting longer
    than the servers' (1 s), the server's query is the one aborted (it logs
    it and reads again) and the flush goes on."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('is_superuser') = 'on'")
        if cursor.fetchone()[0]:  # a superuser's setting
            cursor.execute("SET deadlock_timeout = '10s'")


@dataclass
class World:
    """A tenant with an owner, a viewer and a key: tests build two of these
    so that every test can prove nothing leaks from one to the other."""

    tenant: Tenant
    owner: Membership
    viewer: Membership
    key: object
    secret: str


def _world(name: str) -> World:
    tenant = make_tenant(name=name)
    key, secret = make_key(tenant)
    return World(
        tenant=tenant,
        owner=make_member(tenant, Role.OWNER),
        viewer=make_member(tenant, Role.VIEWER),
        key=key,
        secret=secret,
    )


@pytest.fixture
def world_a(db) -> World:
    return _world("Alpha Corp")


@pytest.fixture
def world_b(db) -> World:
    return _world("Bravo Inc")


@pytest.fixture
def api() -> APIClient:
    return APIClient()


def client_for_key(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def client_for_user(user) -> APIClient:
    client = APIClient()
    client.force_login(user)
    return client
