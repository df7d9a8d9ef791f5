from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import import_module

import pytest
import time_machine
from django.apps import apps as global_apps
from django.db import connections
from django.db.backends.signals import connection_created
from django.db.models.signals import post_migrate
from django.dispatch import receiver
from rest_framework.test import APIClient

from tenants.choices import Role
from tenants.models import Membership, Tenant
from tests.factories import make_key, make_member, make_tenant
from tests.fleet import dynamo_runtime, fleet, gateway, vllm, vllm_cpu, vllm_embed  # noqa: F401 (fixtures for every test package)
from tests.ledger import ledger, ledger_committed  # noqa: F401 (fixtures for every test package)
from tests.own_postgres import own_postgres  # noqa: F401 (fixtures for every test package)
from tests.redis_cluster import redis_cluster  # noqa: F401 (fixtures for every test package)
from tests.services import redis_per_worker
from tests.usage_log import dask_cluster, nats_cluster  # noqa: F401 (fixtures for every test package)

# What a test needs follows from the fixtures it uses, directly or through
# another fixture: each of these marks every test that gets it, so a test
# cannot forget its marker. `./dev test --fast` deselects vllm, containers,
# browser, environment and slow; `./dev test` runs the environment tests in
# a stage of their own. A test that needs one of these without its fixture
# carries the marker by hand (tests/config/test_packaging.py).
MARKERS_BY_FIXTURE = {
    "vllm_cpu": ("vllm", "slow"),  # every fixture that starts a vLLM-CPU replica asks for it
    "dynamo_runtime": ("dynamo", "slow"),  # NVIDIA Dynamo's frontend and mocker workers
    "gateway": ("slow",),  # a real gateway process (the `fleet` fixture's)
    "own_postgres": ("slow",),  # a PostgreSQL server of the test's own, stopped and started
    "nats_cluster": ("slow",),  # three nats-server processes of the test's own (tests/usage_log.py)
    "dask_cluster": ("slow",),  # a Dask scheduler and two workers of the test's own
    "redis_cluster": ("slow",),  # six redis-server processes in cluster mode
    "browser": ("browser", "slow"),  # headless Chromium (tests/browser/conftest.py)
    "images": ("containers", "environment", "slow"),  # the project's images, built
    "compose": ("environment", "slow"),  # docker-compose installed into a venv of its own
}


def pytest_configure(config) -> None:
    redis_per_worker()
    config.addinivalue_line(
        "markers", "real_clock: the test reads the machine's own clock (not the pinned one)"
    )


# The suite's "now": the tests' dates (October 2026 closed, November open)
# are written against it, so no test depends on the day it runs. Tests that
# start processes of their own (marked slow: a gateway, a worker, a server)
# share the machine's clock with them and build their dates from it; the
# month's boundaries have tests of their own (tests/metering/test_month_edges.py).
PINNED_NOW = datetime(2026, 11, 28, 10, 30, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _cache_empty():
    """No sign-in lock-out (tenants.sign_in_limits) carried from one test to the next."""
    from django.core.cache import cache

    cache.clear()


@pytest.fixture(autouse=True)
def pinned_clock(request):
    """Every in-process test runs at PINNED_NOW (the clock ticks on from
    there); `clock.move_to(...)` sets another instant."""
    if request.node.get_closest_marker("slow") or request.node.get_closest_marker("real_clock"):
        yield None
        return
    with time_machine.travel(PINNED_NOW, tick=True) as traveller:
        yield traveller


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        for fixture, markers in MARKERS_BY_FIXTURE.items():
            if fixture in used:
                for marker in markers:
                    item.add_marker(marker)


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


# The rows data migrations make, which a fresh test database holds.
DATA_MIGRATIONS = (
    ("tenants.migrations.0002_finance_group", "create_finance_group"),
    ("billing.migrations.0005_default_issuer", "create"),
)


@receiver(post_migrate, dispatch_uid="tests.data_migrations_again")
def _data_migrations_again(sender, apps=global_apps, **kwargs) -> None:
    """After a transactional test the database is emptied (TRUNCATE) and
    post_migrate sent again: put back what the data migrations made, so
    that every test finds the database as migrated whichever ran before it
    on its worker (pytest-django runs transactional tests last, but under
    xdist a worker may run one before another test). Each is idempotent."""
    if sender.label != "tenants":  # sent once per app: act once
        return
    for module, function in DATA_MIGRATIONS:
        getattr(import_module(module), function)(apps, None)


def _flush_with_the_audit_trail_truncatable() -> None:
    """The audit trail refuses TRUNCATE of itself and records TRUNCATE of a
    watched table (audit.triggers); the suite empties every table at once
    between transactional tests (Django's flush), so the flush runs with the
    session's triggers off (a superuser's session_replication_role), on the
    test database only. tests/audit proves the guards hold."""
    from django.core.management.commands import flush

    handle = flush.Command.handle

    def handle_truncatable(self, **options):
        with connections[options["database"]].cursor() as cursor:
            cursor.execute("SET session_replication_role = replica")
        try:
            return handle(self, **options)
        finally:
            with connections[options["database"]].cursor() as cursor:
                cursor.execute("RESET session_replication_role")

    flush.Command.handle = handle_truncatable


_flush_with_the_audit_trail_truncatable()


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
