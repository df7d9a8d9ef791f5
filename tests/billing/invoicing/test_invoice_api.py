"""The invoice API: a tenant sees only its own issued invoices (not
another's, not drafts), through a key or a session (the pages:
tests/dashboard/test_invoice_pages.py); finance staff see all, move
invoices through their states, credit them, and queue runs; bad input is
a 4xx naming the field with nothing written."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import tasks
from billing.models import CreditGrant, CreditNote, Plan, Subscription
from tests.billing.conftest import OCT
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key

INVOICES = "/api/v1/invoices"


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


def test_a_tenant_reads_only_its_own_issued_invoices(world, issued):
    _, secret = make_key(world.a, scopes=["billing:read"])
    alpha = client_for_key(secret)

    listed = alpha.get(INVOICES).json()
    assert [row["number"] for row in listed] == [issued[world.a.slug].number]
    assert listed[0]["total"] == "4.00" and listed[0]["total_minor"] == 400
    assert listed[0]["amount_due_minor"] == 400

    detail = alpha.get(f"{INVOICES}/{issued[world.a.slug].pk}").json()
    assert [line["amount_billed"] for line in detail["lines"]] == ["4.00"]
    assert alpha.get(f"{INVOICES}/{issued[world.b.slug].pk}").status_code == 404
    assert alpha.get(f"{INVOICES}/{issued['draft'].pk}").status_code == 404
    assert alpha.get(INVOICES, {"tenant": world.b.slug}).status_code == 404
    # Without the billing scope: refused.
    _, usage_only = make_key(world.a, scopes=["usage:read"])
    assert client_for_key(usage_only).get(INVOICES).status_code == 403


def test_finance_sees_every_tenant_and_moves_invoices_on(finance, world, issued):
    rows = finance.get(INVOICES).json()
    assert len(rows) == 3  # drafts included
    assert [r["tenant"] for r in finance.get(INVOICES, {"tenant": world.b.slug}).json()] == [
        world.b.slug
    ]

    # An empty filter is not "no filter": it would list every tenant's invoices.
    empty = finance.get(f"{INVOICES}?tenant=")
    assert empty.status_code == 400
    assert empty.json()["error"]["field"] == "tenant"
    assert "must not be empty" in empty.json()["error"]["message"]
    assert finance.get(f"{INVOICES}?status=&tenant={world.b.slug}").status_code == 400

    draft = issued["draft"]  # November: the period has not ended, so finalized early
    finalized = finance.post(
        f"{INVOICES}/{draft.pk}/status",
        {"status": "finalized", "finalize_early": True, "reason": "customer asked"},
        format="json",
    ).json()
    assert finalized["number"] == "INV-000003" and finalized["status"] == "finalized"

    paid = finance.post(f"{INVOICES}/{draft.pk}/status", {"status": "paid"}, format="json")
    assert paid.status_code == 200 and paid.json()["paid_at"]
    back = finance.post(f"{INVOICES}/{draft.pk}/status", {"status": "void"}, format="json")
    assert back.status_code == 409 and back.json()["error"]["code"] == "invoice_state"
    bad = finance.post(f"{INVOICES}/{draft.pk}/status", {"status": "draft"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "status"


def test_credit_notes_through_the_api_name_the_bad_field_and_write_nothing(finance, world, issued):
    invoice = issued[world.a.slug]
    url = f"{INVOICES}/{invoice.pk}/credit-notes"

    too_much = finance.post(url, {"amount_minor": 401, "reason": "x"}, format="json")
    assert too_much.status_code == 400 and too_much.json()["error"]["field"] == "amount_minor"
    missing = finance.post(url, {"amount_minor": 100}, format="json")
    assert missing.status_code == 400 and missing.json()["error"]["field"] == "reason"
    assert not CreditNote.objects.exists()

    note = finance.post(url, {"amount_minor": 100, "reason": "SLA credit"}, format="json")
    assert note.status_code == 201 and note.json()["number"] == "CN-000001"
    assert finance.get(f"{INVOICES}/{invoice.pk}").json()["amount_due_minor"] == 300
    # Tenants cannot issue credit notes.
    _, secret = make_key(world.a)
    assert (
        client_for_key(secret)
        .post(url, {"amount_minor": 1, "reason": "me"}, format="json")
        .status_code
        == 403
    )


def test_invoice_runs_are_queued_and_watched(
    finance, world, monkeypatch, django_capture_on_commit_callbacks
):
    sent: list[int] = []
    monkeypatch.setattr(tasks.invoice_run_task, "delay", sent.append)

    with django_capture_on_commit_callbacks(execute=True):
        response = finance.post(
            "/api/v1/invoice-runs",
            {"as_of": "2026-11-02T00:00:00Z", "finalize": False},
            format="json",
        )

    assert response.status_code == 202, response.json()
    run = response.json()
    assert sent == [run["id"]] and run["status"] == "queued" and run["finalize"] is False
    tasks.invoice_run_task(run["id"])
    watched = finance.get(f"/api/v1/invoice-runs/{run['id']}").json()
    assert watched["status"] == "done" and watched["tenants_total"] == watched["tenants_done"]
    bad = finance.post("/api/v1/invoice-runs", {"as_of": "yesterday"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "as_of"


def test_the_credit_balance_is_the_callers_own(world):
    CreditGrant.objects.create(tenant=world.a, amount=Decimal("12.5"), granted_at=OCT)
    CreditGrant.objects.create(tenant=world.b, amount=Decimal("99"), granted_at=OCT)
    _, secret = make_key(world.a, scopes=["billing:read"])

    balances = client_for_key(secret).get("/api/v1/credits").json()

    assert [b["remaining_minor"] for b in balances] == [1250]


def test_where_a_tenant_stands_is_its_own_and_only_finance_grants_credit(world, settings):
    settings.REDIS_URL = ""  # no shared counters: the ledger's figures
    plan = Plan.objects.create(name="Prepaid", prepaid=True)
    for tenant, credit in ((world.a, "12.5"), (world.b, "99")):
        Subscription.objects.create(tenant=tenant, plan=plan, start=OCT)
        CreditGrant.objects.create(tenant=tenant, amount=Decimal(credit), granted_at=OCT)
    _, secret = make_key(world.a, scopes=["billing:read"])
    alpha = client_for_key(secret)

    (standing,) = alpha.get("/api/v1/spend").json()
    assert (standing["kind"], Decimal(standing["limit"])) == ("prepaid", Decimal("12.5"))
    assert alpha.get(f"/api/v1/spend?tenant={world.b.slug}").status_code == 404
    granted = alpha.post(
        "/api/v1/credit-grants", {"tenant": world.a.slug, "amount": "5"}, format="json"
    )
    assert granted.status_code == 403
    assert CreditGrant.objects.filter(tenant=world.a).count() == 1
