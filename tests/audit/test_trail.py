"""The audit trail, reached the way users reach it: changes made on the
pages, through the API, in the admin, by a job and behind the ORM's back
are each recorded with who, from where, and before and after; the database
refuses to change or delete an entry; finance sees everything, a tenant's
owners only their own tenant's, and nobody else any of it."""

from __future__ import annotations

import csv
import io
from datetime import date

import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from audit.models import AuditEntry
from audit.tracked import TRACKED
from audit.triggers import tables_without_trigger
from billing.models import FxRate
from tenants.models import ApiKey
from tenants.services import api_keys_mark_used
from tests.conftest import client_for_key
from tests.factories import make_finance_user, make_key

pytestmark = pytest.mark.django_db


def recorded(**kwargs) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**kwargs).order_by("id"))


def test_every_tracked_table_exists_and_has_its_trigger():
    with connection.cursor() as cursor:
        for tracked in TRACKED:
            cursor.execute("SELECT to_regclass(%s)", [tracked.table])
            assert cursor.fetchone()[0] is not None, tracked.table
    assert tables_without_trigger(connection) == []


def test_an_owner_creating_and_revoking_a_key_on_the_keys_page_is_recorded(
    client, world_a, world_b
):
    owner = world_a.owner.user
    client.force_login(owner)
    assert client.post("/keys/", {"name": "ci", "scopes": ["usage:read"]}).status_code == 303
    key = ApiKey.objects.get(name="ci")

    [created] = recorded(table="tenants_apikey", row_id=str(key.pk))
    assert (created.action, created.actor, created.actor_user_id, created.via) == (
        "insert",
        owner.username,
        owner.pk,
        "session",
    )
    assert created.tenant_id == world_a.tenant.pk and created.request == "POST /keys/"
    assert created.after["name"] == "ci" and created.after["scopes"] == ["usage:read"]
    assert "secret_hash" not in created.after  # the key's HMAC is never copied

    assert client.post(f"/keys/{key.pk}/revoke/").status_code == 302
    revoked = recorded(table="tenants_apikey", row_id=str(key.pk))[-1]
    assert revoked.action == "update"
    assert revoked.changed == ["revoked_at", "revoked_by_id"]
    assert revoked.before["revoked_at"] is None and revoked.after["revoked_by_id"] == owner.pk
    assert revoked.request == f"POST /keys/{key.pk}/revoke/"


def test_a_key_being_used_makes_no_entry(world_a):
    from django.utils import timezone

    before = AuditEntry.objects.count()
    assert api_keys_mark_used(used_at_by_key={world_a.key.pk: timezone.now()}) == 1
    assert AuditEntry.objects.count() == before


def test_finance_voiding_an_invoice_through_the_api_is_recorded(issued, world, api):
    fran = make_finance_user(username="fran")
    invoice = issued[world.a.slug]
    api.force_authenticate(fran)
    api.force_login(fran)

    answer = api.post(f"/api/v1/invoices/{invoice.pk}/status", {"status": "void"}, format="json")

    assert answer.status_code == 200, answer.content
    entry = recorded(table="billing_invoice", row_id=str(invoice.pk))[-1]
    assert (entry.action, entry.actor, entry.via, entry.tenant_id) == (
        "update",
        "fran",
        "session",
        world.a.pk,
    )
    assert "status" in entry.changed and "voided_at" in entry.changed
    assert (entry.before["status"], entry.after["status"]) == ("finalized", "void")
    assert entry.request == f"POST /api/v1/invoices/{invoice.pk}/status"


def test_a_password_set_in_the_admin_is_named_and_its_hash_never_copied(client):
    admin = make_finance_user(username="root", is_staff=True, is_superuser=True)
    person = make_finance_user(username="fay")
    client.force_login(admin)
    before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first()
    answer = client.post(
        f"/admin/auth/user/{person.pk}/password/",
        {"password1": "a-new-long-password-7", "password2": "a-new-long-password-7"},
    )
    assert answer.status_code == 302, answer.content[:300]

    entries = recorded(table="auth_user", row_id=str(person.pk), id__gt=before)
    assert [(e.action, e.actor, e.via, e.changed) for e in entries] == [
        ("update", "root", "admin", ["password"])
    ]
    [entry] = entries
    assert "password" not in entry.before and "password" not in entry.after


def test_a_change_in_the_admin_is_recorded_as_the_admins(client):
    admin = make_finance_user(username="root", is_staff=True, is_superuser=True)
    client.force_login(admin)
    answer = client.post(
        "/admin/billing/fxrate/add/",
        {"base": "EUR", "quote": "USD", "date": "2026-11-02", "rate": "1.08", "source": "ECB"},
    )
    assert answer.status_code == 302, answer.content
    rate = FxRate.objects.get(date=date(2026, 11, 2))
    [entry] = recorded(table="billing_fxrate", row_id=str(rate.pk))
    assert (entry.action, entry.actor, entry.via) == ("insert", "root", "admin")
    assert entry.after["rate"] == 1.08 and entry.tenant_id is None


def test_a_write_behind_the_orms_back_is_recorded_as_the_database_role(world_a):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE tenants_tenantpolicy SET max_concurrent_requests = 7 WHERE tenant_id = %s",
            [world_a.tenant.pk],
        )
        cursor.execute("SELECT session_user")
        role = cursor.fetchone()[0]
    entry = recorded(table="tenants_tenantpolicy")[-1]
    assert (entry.actor, entry.via, entry.changed) == (
        f"database:{role}",
        "database",
        ["max_concurrent_requests"],
    )
    assert entry.after["max_concurrent_requests"] == 7 and entry.tenant_id == world_a.tenant.pk


def test_a_jobs_change_is_recorded_as_the_job(world_a, settings):
    from celery import shared_task

    @shared_task(name="tests.audit.suspend")
    def suspend(tenant_id):
        from tenants.models import Tenant
        from tenants.services import tenant_set_status

        tenant_set_status(tenant=Tenant.objects.get(pk=tenant_id), status="suspended")

    suspend.apply(args=[world_a.tenant.pk])

    entry = recorded(table="tenants_tenant", row_id=str(world_a.tenant.pk))[-1]
    assert (entry.actor, entry.via, entry.changed) == ("job:tests.audit.suspend", "job", ["status"])
    assert entry.request.startswith("task ")
    # After the task the connection is nobody's again.
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('gpu_ledger.actor', true)")
        assert cursor.fetchone()[0] == ""


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE audit_auditentry SET actor = 'someone else'",
        "DELETE FROM audit_auditentry",
        "TRUNCATE audit_auditentry",
    ],
)
def test_the_database_refuses_to_change_or_delete_an_entry(world_a, statement):
    count = AuditEntry.objects.count()
    assert count > 0
    with (
        pytest.raises(DatabaseError, match="audit entries are append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the links made, as at a commit
        cursor.execute(statement)
    assert AuditEntry.objects.count() == count
    assert not AuditEntry.objects.filter(actor="someone else").exists()


@pytest.fixture
def changes(world_a, world_b):
    """A policy change in each tenant, and a fleet fact (no tenant)."""
    from serving.models import GpuSku
    from tenants.services import policy_budget_set

    for each in (world_a, world_b):
        policy_budget_set(tenant=each.tenant, monthly_budget="100.00", soft_percent=50)
    GpuSku.objects.create(name="H200", power_idle_watts=100, power_busy_watts=700)
    return world_a, world_b


def test_finance_sees_every_entry_and_filters_them(client, changes):
    world_a, world_b = changes
    client.force_login(make_finance_user())
    page = client.get("/audit/").content.decode()
    assert f'data-entry="{recorded(table="serving_gpusku")[0].pk}"' in page
    for each in (world_a, world_b):
        assert each.tenant.slug in page

    only_a = client.get("/audit/", {"tenant": world_a.tenant.slug, "table": "tenants_tenantpolicy"})
    shown = only_a.content.decode()
    ids = [e.pk for e in recorded(table="tenants_tenantpolicy", tenant_id=world_a.tenant.pk)]
    assert ids and all(f'data-entry="{i}"' in shown for i in ids)
    others = recorded(tenant_id=world_b.tenant.pk) + recorded(table="serving_gpusku")
    assert not any(f'data-entry="{e.pk}"' in shown for e in others)


def test_a_tenants_owner_sees_only_their_tenants_entries_and_nobody_else_any(client, changes):
    world_a, world_b = changes
    client.force_login(world_a.owner.user)
    page = client.get("/audit/").content.decode()
    mine = recorded(tenant_id=world_a.tenant.pk)
    assert mine and all(f'data-entry="{e.pk}"' in page for e in mine)
    theirs = recorded(tenant_id=world_b.tenant.pk) + recorded(tenant_id__isnull=True)
    assert not any(f'data-entry="{e.pk}"' in page for e in theirs)
    # Asking for the other tenant changes nothing: the page is the owner's tenant's.
    asked = client.get("/audit/", {"tenant": world_b.tenant.slug}).content.decode()
    assert not any(f'data-entry="{e.pk}"' in asked for e in theirs)

    client.force_login(world_a.viewer.user)
    assert client.get("/audit/").status_code == 403


def test_the_csv_export_holds_the_filtered_entries(client, changes):
    world_a, _ = changes
    client.force_login(world_a.owner.user)
    answer = client.get("/audit/", {"action": "update", "format": "csv"})
    assert answer["Content-Type"] == "text/csv"
    rows = list(csv.DictReader(io.StringIO(b"".join(answer.streaming_content).decode())))
    expected = recorded(tenant_id=world_a.tenant.pk, action="update")
    assert [int(r["id"]) for r in rows] == [e.pk for e in reversed(expected)]
    assert {r["tenant"] for r in rows} == {world_a.tenant.slug}
    assert rows[0]["subject"] == "Tenant policy"


def test_a_bad_filter_is_a_400_naming_the_field(client, changes, api):
    world_a, _ = changes
    client.force_login(world_a.owner.user)
    page = client.get("/audit/", {"since": "2026-13-01", "action": "explode"})
    assert page.status_code == 400
    text = page.content.decode()
    assert 'data-testid="error-since"' in text and 'data-testid="error-action"' in text

    api.force_login(world_a.owner.user)
    answer = api.get("/api/v1/audit/entries", {"since": "2026-11-05", "until": "2026-11-01"})
    assert answer.status_code == 400
    assert "until" in str(answer.json())


def test_the_api_gives_a_keys_own_tenants_entries_a_page_at_a_time(changes):
    world_a, world_b = changes
    _, secret = make_key(world_a.tenant, scopes=("audit:read",))
    api = client_for_key(secret)
    first = api.get("/api/v1/audit/entries", {"limit": 1}).json()
    mine = recorded(tenant_id=world_a.tenant.pk)
    assert [e["id"] for e in first["results"]] == [mine[-1].pk]
    assert first["next_before"] == mine[-1].pk
    rest = api.get("/api/v1/audit/entries", {"before": first["next_before"], "limit": 1000})
    assert [e["id"] for e in rest.json()["results"]] == [e.pk for e in reversed(mine[:-1])]
    assert rest.json()["next_before"] is None
    assert api.get("/api/v1/audit/entries", {"tenant": world_b.tenant.slug}).status_code == 404

    _, usage_only = make_key(world_a.tenant, scopes=("usage:read",))
    assert client_for_key(usage_only).get("/api/v1/audit/entries").status_code == 403


def test_only_an_owner_grants_a_key_that_reads_the_audit_trail(client, world_a):
    from tenants.choices import Role
    from tests.factories import make_member

    admin = make_member(world_a.tenant, Role.ADMIN).user
    client.force_login(admin)
    refused = client.post("/keys/", {"name": "siem", "scopes": ["audit:read"]})
    assert refused.status_code == 400
    assert "only the tenant&#x27;s owners may grant" in refused.content.decode()
    assert not ApiKey.objects.filter(name="siem").exists()
    client.force_login(world_a.owner.user)
    assert client.post("/keys/", {"name": "siem", "scopes": ["audit:read"]}).status_code == 303


def test_a_job_run_inside_a_request_hands_the_request_its_actor_back(world_a):
    from audit.context import Actor, acting_as
    from tenants.services import tenant_set_status

    tenant = world_a.tenant
    with acting_as(Actor(name="olga", via="session", request="POST /x")):
        tenant_set_status(tenant=tenant, status="suspended")
        with acting_as(Actor(name="job:inner", via="job")):
            tenant_set_status(tenant=tenant, status="active")
        tenant_set_status(tenant=tenant, status="suspended")
    tenant_set_status(tenant=tenant, status="active")

    entries = recorded(table="tenants_tenant", row_id=str(tenant.pk), action="update")
    assert [(e.actor, e.after["status"]) for e in entries] == [
        ("olga", "suspended"),
        ("job:inner", "active"),
        ("olga", "suspended"),
        (f"database:{connection.settings_dict['USER']}", "active"),
    ]
