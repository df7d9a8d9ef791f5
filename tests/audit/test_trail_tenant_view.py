"""Tenants read their own trail, not finance's (issue 60, finding 7),
attacked as a tenant would: an owner's session and an `audit:read` key ask
the trail for billing_invoice and for finance's SLA decisions. A draft, its
totals and rating warnings, and finance's reasons stay finance's; the
finalized invoice is there, as invoice reads show it. Finance reads it all."""

from __future__ import annotations

from datetime import UTC, datetime

from audit.context import Actor, acting_as
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import SlaCreditAdjustment
from tests.billing.conftest import NOV, OCT, make_world
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key, make_member

ENTRIES = "/api/v1/audit/entries"


def test_a_tenant_never_reads_drafts_or_finances_notes_through_the_trail(db):
    world = make_world()
    world.price()
    world.tokens(world.a, hour=datetime(2026, 10, 5, 12, tzinfo=UTC), completion=1_000_000)
    world.tokens(world.a, hour=datetime(2026, 10, 6, 12, tzinfo=UTC), completion=10**6, prompt=7)
    with acting_as(Actor(name="fran", via="session", request="POST /invoices/")):
        draft, _ = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)
        SlaCreditAdjustment.objects.create(
            tenant=world.a, period_start=OCT, metric="availability", action="waive",
            reason="their own outage, per the account manager",
        )  # fmt: skip
        invoice_finalize(invoice_id=draft.pk)

    owner = client_for_user(make_member(world.a).user)
    _, secret = make_key(world.a, scopes=("audit:read",))
    for reader in (owner, client_for_key(secret)):
        seen = reader.get(ENTRIES, {"table": "billing_invoice", "limit": 1000}).json()["results"]
        # Only the finalization: never the draft it was, nor finance's columns.
        assert [(e["action"], e["after"]["status"]) for e in seen] == [("update", "finalized")]
        assert seen[0]["before"] is None
        assert "warnings" not in seen[0]["after"] and "usage_fingerprint" not in seen[0]["after"]
        assert "warnings" not in seen[0]["changed"]
        notes = reader.get(ENTRIES, {"table": "billing_slacreditadjustment"}).json()["results"]
        assert notes == []
        exported = reader.get("/api/v1/audit/export")
        assert exported.status_code == 200
        csv = b"".join(exported.streaming_content).decode()
        assert "finalized" in csv  # the export has the finalization, and nothing of finance's
        assert "account manager" not in csv and '"status": "draft"' not in csv

    finance = client_for_user(make_finance_user())
    everything = finance.get(ENTRIES, {"tenant": world.a.slug, "limit": 1000}).json()["results"]
    tables = [(e["table"], e["action"]) for e in everything]
    assert ("billing_invoice", "insert") in tables
    assert ("billing_slacreditadjustment", "insert") in tables
