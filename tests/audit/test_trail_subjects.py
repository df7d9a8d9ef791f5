"""Each subject the audit trail covers, changed where users change it:
finance staff through /api/v1/..., and the Django admin for what has no
API or page (price books, memberships). Every change is recorded with who
(actor, actor_user_id), from where (via), the request, and the row before
and after. The trail is then read back through /api/v1/audit/...: finance
sees and filters every tenant's entries, a tenant's owner only its own.

No API key can write an audited table (every write route is finance staff's
or a signed-in member's), so an entry made `via="api_key"` has no route to
test here."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from audit.models import AuditEntry
from audit.selectors import CSV_COLUMNS
from billing.models import CostRate, CreditGrant, CreditNote, ModelPrice, PriceBook
from serving.models import Gpu, GpuSku, Node, ServedModel
from tenants.choices import Role
from tenants.models import Membership
from tests.conftest import client_for_key, client_for_user
from tests.factories import UserFactory, make_finance_user, make_key

pytestmark = pytest.mark.django_db


def recorded(**kwargs) -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(**kwargs).order_by("id"))


def who(entry: AuditEntry) -> tuple:
    """What an entry says of the change's origin: action, actor, user, via, request."""
    return (entry.action, entry.actor, entry.actor_user_id, entry.via, entry.request)


def inline(prefix: str, rows: list[dict]) -> dict:
    """An admin inline formset's POST data (its management form and rows)."""
    data = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": "0",
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for i, row in enumerate(rows):
        data |= {f"{prefix}-{i}-{name}": value for name, value in row.items()}
    return data


@pytest.fixture
def fran(db):
    return make_finance_user(username="fran")


@pytest.fixture
def finance(fran):
    """Finance staff's signed-in session, calling the API."""
    return client_for_user(fran)


@pytest.fixture
def root(db):
    return make_finance_user(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def admin_site(client, root):
    client.force_login(root)
    return client


# --- Prices (rate cards): the admin is where price books are written. ---


def test_a_price_book_and_a_model_price_changed_in_the_admin_are_recorded(admin_site, root):
    model = ServedModel.objects.create(name="tiny")
    row = {"served_model": model.pk, "input_per_mtok": "1", "cached_input_per_mtok": "0.25"}
    book_form = {
        "name": "list",
        "version": "3",
        "tier": "",
        "currency": "USD",
        "effective_from_0": "2026-12-01",
        "effective_from_1": "00:00:00",
        "effective_to_0": "",
        "effective_to_1": "",
        "reservation_per_gpu_hour": "0",
        "dedicated_per_gpu_month": "0",
    }
    added = admin_site.post(
        "/admin/billing/pricebook/add/",
        book_form | inline("prices", [row | {"output_per_mtok": "4"}]),
    )
    assert added.status_code == 302, added.content
    book = PriceBook.objects.get(name="list", version=3)
    price = ModelPrice.objects.get(book=book)
    add = "POST /admin/billing/pricebook/add/"

    [book_entry] = recorded(table="billing_pricebook", row_id=str(book.pk))
    assert who(book_entry) == ("insert", "root", root.pk, "admin", add)
    assert book_entry.after["version"] == 3 and book_entry.tenant_id is None
    [price_entry] = recorded(table="billing_modelprice", row_id=str(price.pk))
    assert who(price_entry) == ("insert", "root", root.pk, "admin", add)
    assert price_entry.after["output_per_mtok"] == 4

    change = f"/admin/billing/modelprice/{price.pk}/change/"
    edit = row | {"book": book.pk, "output_per_mtok": "5.5", "per_gpu_second": ""}
    answer = admin_site.post(change, edit | inline("tiers", []))
    assert answer.status_code == 302, answer.content
    entry = recorded(table="billing_modelprice", row_id=str(price.pk))[-1]
    assert who(entry) == ("update", "root", root.pk, "admin", f"POST {change}")
    assert entry.changed == ["output_per_mtok"]
    assert (entry.before["output_per_mtok"], entry.after["output_per_mtok"]) == (4, 5.5)


# --- Cost rates: billing/api/costs.py. ---


def test_finance_booking_and_editing_a_cost_rate_through_the_api_is_recorded(finance, fran):
    later = (datetime.now(UTC) + timedelta(days=30)).date().isoformat()
    body = {"component": "energy", "basis": "per_kwh", "amount": "0.10", "effective_from": later}
    created = finance.post("/api/v1/costs/rates", body, format="json")
    assert created.status_code == 201, created.content
    rate = CostRate.objects.get(pk=created.json()["id"])

    [insert] = recorded(table="billing_costrate", row_id=str(rate.pk))
    assert who(insert) == ("insert", "fran", fran.pk, "session", "POST /api/v1/costs/rates")
    assert insert.after["amount"] == 0.1 and insert.after["created_by_id"] == fran.pk

    path = f"/api/v1/costs/rates/{rate.pk}"
    edited = finance.patch(path, {"amount": "0.12"}, format="json")
    assert edited.status_code == 200, edited.content
    update = recorded(table="billing_costrate", row_id=str(rate.pk))[-1]
    assert who(update) == ("update", "fran", fran.pk, "session", f"PATCH {path}")
    assert update.changed == ["amount"]
    assert (update.before["amount"], update.after["amount"]) == (0.1, 0.12)


# --- Budgets and policies: billing/api/spend.py BudgetView. ---


def test_finance_setting_a_tenants_budget_through_the_api_is_recorded(
    finance, fran, world_a, world_b
):
    path = f"/api/v1/tenants/{world_a.tenant.slug}/budget"
    answer = finance.put(path, {"monthly_budget": "250.00"}, format="json")
    assert answer.status_code == 200, answer.content

    policy = world_a.tenant.policy
    entries = recorded(table="tenants_tenantpolicy", row_id=str(policy.pk), action="update")
    [entry] = [e for e in entries if "monthly_budget" in e.changed]
    assert who(entry) == ("update", "fran", fran.pk, "session", f"PUT {path}")
    assert entry.tenant_id == world_a.tenant.pk
    assert (entry.before["monthly_budget"], entry.after["monthly_budget"]) == (None, 250)
    assert not recorded(table="tenants_tenantpolicy", tenant_id=world_b.tenant.pk, actor="fran")


# --- Credit grants: billing/api/spend.py CreditGrantCreateView. ---


def test_finance_granting_credit_through_the_api_is_recorded(finance, fran, world_a):
    body = {"tenant": world_a.tenant.slug, "amount": "50.00", "note": "goodwill"}
    answer = finance.post("/api/v1/credit-grants", body, format="json")
    assert answer.status_code == 201, answer.content
    grant = CreditGrant.objects.get(pk=answer.json()["id"])

    [entry] = recorded(table="billing_creditgrant", row_id=str(grant.pk))
    assert who(entry) == ("insert", "fran", fran.pk, "session", "POST /api/v1/credit-grants")
    assert entry.tenant_id == world_a.tenant.pk
    assert entry.before is None and entry.after["amount"] == 50
    assert entry.after["note"] == "goodwill"


# --- Invoices: finalizing a draft, and a credit note on a finalized one. ---


def test_finance_finalizing_an_invoice_through_the_api_is_recorded(finance, fran, issued, world):
    draft = issued["draft"]
    path = f"/api/v1/invoices/{draft.pk}/status"
    body = {"status": "finalized", "finalize_early": True, "reason": "customer asked"}
    answer = finance.post(path, body, format="json")
    assert answer.status_code == 200, answer.content

    entries = recorded(table="billing_invoice", row_id=str(draft.pk), action="update")
    [entry] = [e for e in entries if "status" in e.changed]
    assert who(entry) == ("update", "fran", fran.pk, "session", f"POST {path}")
    assert entry.tenant_id == world.a.pk
    assert (entry.before["status"], entry.after["status"]) == ("draft", "finalized")
    # The number is written by a statement of its own, in the same transaction.
    [numbered] = [e for e in entries if "number" in e.changed]
    assert who(numbered) == who(entry) and numbered.transaction_id == entry.transaction_id
    draft.refresh_from_db()
    assert (numbered.before["number"], numbered.after["number"]) == ("", draft.number)


def test_finance_issuing_a_credit_note_through_the_api_is_recorded(finance, fran, issued, world):
    invoice = issued[world.a.slug]
    path = f"/api/v1/invoices/{invoice.pk}/credit-notes"
    answer = finance.post(path, {"amount_minor": 100, "reason": "outage"}, format="json")
    assert answer.status_code == 201, answer.content
    note = CreditNote.objects.get(invoice=invoice)

    [entry] = recorded(table="billing_creditnote", row_id=str(note.pk))
    assert who(entry) == ("insert", "fran", fran.pk, "session", f"POST {path}")
    assert entry.tenant_id == world.a.pk  # through the invoice it credits
    assert entry.after["amount_minor"] == 100 and entry.after["reason"] == "outage"
    assert entry.after["created_by_id"] == fran.pk


# --- Memberships: the admin is where members are added and their roles changed. ---


def test_adding_a_member_and_changing_their_role_in_the_admin_is_recorded(
    admin_site, root, world_a, world_b
):
    user = UserFactory(username="newcomer")
    tenant = world_a.tenant
    add = "/admin/tenants/membership/add/"
    answer = admin_site.post(add, {"user": user.pk, "tenant": tenant.pk, "role": Role.VIEWER})
    assert answer.status_code == 302, answer.content
    membership = Membership.objects.get(user=user, tenant=tenant)

    [insert] = recorded(table="tenants_membership", row_id=str(membership.pk))
    assert who(insert) == ("insert", "root", root.pk, "admin", f"POST {add}")
    assert insert.tenant_id == tenant.pk
    assert (insert.after["user_id"], insert.after["role"]) == (user.pk, "viewer")

    change = f"/admin/tenants/membership/{membership.pk}/change/"
    answer = admin_site.post(change, {"user": user.pk, "tenant": tenant.pk, "role": Role.ADMIN})
    assert answer.status_code == 302, answer.content
    update = recorded(table="tenants_membership", row_id=str(membership.pk))[-1]
    assert who(update) == ("update", "root", root.pk, "admin", f"POST {change}")
    assert update.changed == ["role"]
    assert (update.before["role"], update.after["role"]) == ("viewer", "admin")
    assert not recorded(table="tenants_membership", tenant_id=world_b.tenant.pk, actor="root")


# --- The fleet's cost facts: /api/v1/fleet/... (serving/api/views.py). ---


def _sku():
    return GpuSku.objects.create(name="T-100", power_idle_watts=100, power_busy_watts=400)


FLEET = {
    # resource: (model, body to create it, a change, the changed column, before, after)
    "gpu-skus": (
        GpuSku,
        lambda: {"name": "H200", "power_idle_watts": 100, "power_busy_watts": 700},
        {"list_price": "31000"},
        "list_price",
        0,
        31000,
    ),
    "nodes": (
        Node,
        lambda: {"name": "node-a", "site": "fra1"},
        {"site": "ams2"},
        "site",
        "fra1",
        "ams2",
    ),
    "gpus": (
        Gpu,
        lambda: {
            "serial": "GPU-1",
            "sku": _sku().pk,
            "node": Node.objects.create(name="node-1").pk,
            "in_service_date": "2026-01-01",
            "capex": "30000",
            "useful_life_months": 48,
        },
        {"salvage_value": "3000"},
        "salvage_value",
        0,
        3000,
    ),
}


@pytest.mark.parametrize("resource", list(FLEET))
def test_finance_registering_and_changing_fleet_cost_facts_through_the_api_is_recorded(
    finance, fran, resource
):
    model, body, change, column, before, after = FLEET[resource]
    path = f"/api/v1/fleet/{resource}"
    created = finance.post(path, body(), format="json")
    assert created.status_code == 201, created.content
    pk = created.json()["id"]
    table = model._meta.db_table

    [insert] = recorded(table=table, row_id=str(pk))
    assert who(insert) == ("insert", "fran", fran.pk, "session", f"POST {path}")
    assert insert.tenant_id is None and insert.after[column] == before

    changed = finance.patch(f"{path}/{pk}", change, format="json")
    assert changed.status_code == 200, changed.content
    update = recorded(table=table, row_id=str(pk))[-1]
    assert who(update) == ("update", "fran", fran.pk, "session", f"PATCH {path}/{pk}")
    assert update.changed == [column]
    assert (update.before[column], update.after[column]) == (before, after)


# --- Reading the trail through the API. ---


@pytest.fixture
def changes(finance, world_a, world_b):
    """Finance's budget change in each tenant, and a fleet fact (no tenant)."""
    for each in (world_a, world_b):
        path = f"/api/v1/tenants/{each.tenant.slug}/budget"
        assert finance.put(path, {"monthly_budget": "100.00"}, format="json").status_code == 200
    sku = {"name": "H200", "power_idle_watts": 100, "power_busy_watts": 700}
    assert finance.post("/api/v1/fleet/gpu-skus", sku, format="json").status_code == 201
    return world_a, world_b


def test_finance_filters_the_trail_and_an_owner_reads_only_their_tenants(finance, changes):
    world_a, world_b = changes
    query = {"tenant": world_a.tenant.slug, "table": "tenants_tenantpolicy", "actor": "fran"}
    answer = finance.get("/api/v1/audit/entries", query)
    assert answer.status_code == 200, answer.content
    results = answer.json()["results"]
    expected = recorded(table="tenants_tenantpolicy", tenant_id=world_a.tenant.pk, actor="fran")
    assert expected and [e["id"] for e in results] == [e.pk for e in reversed(expected)]
    assert {(e["tenant"], e["via"], e["subject"]) for e in results} == {
        (world_a.tenant.slug, "session", "Tenant policy")
    }
    assert results[-1]["request"] == f"PUT /api/v1/tenants/{world_a.tenant.slug}/budget"
    # Unfiltered, finance sees both tenants and the fleet.
    everything = finance.get("/api/v1/audit/entries", {"limit": 1000}).json()["results"]
    assert {e["tenant"] for e in everything} >= {world_a.tenant.slug, world_b.tenant.slug, None}

    _, secret = make_key(world_a.tenant, scopes=("audit:read",))
    for owner in (client_for_key(secret), client_for_user(world_a.owner.user)):
        mine = owner.get("/api/v1/audit/entries", {"limit": 1000})
        assert mine.status_code == 200, mine.content
        ids = [e["id"] for e in mine.json()["results"]]
        assert ids == [e.pk for e in reversed(recorded(tenant_id=world_a.tenant.pk))]
        theirs = recorded(tenant_id=world_b.tenant.pk) + recorded(tenant_id__isnull=True)
        assert theirs and not {e.pk for e in theirs} & set(ids)
        asked = owner.get("/api/v1/audit/entries", {"tenant": world_b.tenant.slug})
        assert asked.status_code == 404


def test_the_api_csv_export_holds_the_filtered_entries(finance, changes):
    world_a, _ = changes
    query = {"table": "tenants_tenantpolicy", "action": "update", "via": "session"}
    answer = finance.get("/api/v1/audit/export", query)
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/csv"
    text = b"".join(answer.streaming_content).decode()
    header, *lines = list(csv.reader(io.StringIO(text)))
    assert header == list(CSV_COLUMNS)
    rows = [dict(zip(header, line, strict=True)) for line in lines]
    expected = recorded(table="tenants_tenantpolicy", action="update", via="session")
    assert len(expected) >= 2  # both tenants' budgets
    assert [int(r["id"]) for r in rows] == [e.pk for e in reversed(expected)]
    assert {(r["table"], r["action"], r["via"], r["actor"]) for r in rows} == {
        ("tenants_tenantpolicy", "update", "session", "fran")
    }

    _, secret = make_key(world_a.tenant, scopes=("audit:read",))
    owned = client_for_key(secret).get("/api/v1/audit/export", query)
    own_text = b"".join(owned.streaming_content).decode()
    own_rows = list(csv.DictReader(io.StringIO(own_text)))
    mine = [e for e in expected if e.tenant_id == world_a.tenant.pk]
    assert [int(r["id"]) for r in own_rows] == [e.pk for e in reversed(mine)]
    assert {r["tenant"] for r in own_rows} == {world_a.tenant.slug}
