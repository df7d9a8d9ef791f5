"""Billing 0012 and tenants 0005 move each tenant's Stripe customer id
from the tenant's column to billing's StripeCustomer, and back when
migrated backwards, losing none and inventing none."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)  # migrations run their own DDL

BEFORE = [("billing", "0011_invoice_finalize_early")]  # tenants 0005 goes too
AFTER = [("billing", "0012_stripe_customer"), ("tenants", "0005_remove_tenant_stripe_customer_id")]


def _migrate(targets):
    """Migrate to `targets`; the models as they are there."""
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    executor.loader.build_graph()
    return executor.loader.project_state(targets).apps


@pytest.fixture
def migrator():
    yield _migrate
    executor = MigrationExecutor(connection)
    _migrate(executor.loader.graph.leaf_nodes())


def _tenant_columns() -> set[str]:
    with connection.cursor() as cursor:
        columns = connection.introspection.get_table_description(cursor, "tenants_tenant")
    return {column.name for column in columns}


def test_customer_ids_move_to_billing_and_back(migrator):
    old = migrator(BEFORE)
    Tenant = old.get_model("tenants", "Tenant")
    alpha = Tenant.objects.create(name="Alpha", slug="alpha", stripe_customer_id="cus_alpha")
    bravo = Tenant.objects.create(name="Bravo", slug="bravo")  # no customer yet

    new = migrator(AFTER)
    StripeCustomer = new.get_model("billing", "StripeCustomer")
    rows = {row.tenant_id: row.stripe_customer_id for row in StripeCustomer.objects.all()}
    assert rows == {alpha.pk: "cus_alpha"}
    assert "stripe_customer_id" not in _tenant_columns()
    StripeCustomer.objects.create(tenant_id=bravo.pk, stripe_customer_id="cus_bravo")

    old = migrator(BEFORE)
    Tenant = old.get_model("tenants", "Tenant")
    ids = dict(Tenant.objects.values_list("slug", "stripe_customer_id"))
    assert ids == {"alpha": "cus_alpha", "bravo": "cus_bravo"}
    assert "stripe_customer_id" in _tenant_columns()


def test_a_customer_shared_by_two_tenants_stops_the_migration(migrator):
    old = migrator(BEFORE)
    Tenant = old.get_model("tenants", "Tenant")
    Tenant.objects.create(name="Alpha", slug="alpha", stripe_customer_id="cus_same")
    Tenant.objects.create(name="Bravo", slug="bravo", stripe_customer_id="cus_same")

    with pytest.raises(RuntimeError, match="cus_same"):
        migrator(AFTER)
    assert "stripe_customer_id" in _tenant_columns()
    assert list(Tenant.objects.values_list("stripe_customer_id", flat=True)) == ["cus_same"] * 2

    Tenant.objects.filter(slug="bravo").update(stripe_customer_id="")  # unlinked by hand
    new = migrator(AFTER)
    StripeCustomer = new.get_model("billing", "StripeCustomer")
    assert list(StripeCustomer.objects.values_list("tenant__slug", "stripe_customer_id")) == [
        ("alpha", "cus_same")
    ]
