"""Finance's prices pages (issue 59, item 6): the `finance` login, not
staff, lists price books with their versions' status, starts a new
version from a date with a copy of the prices, adds plans, moves a tenant
to a plan from a date and edits its policy; a version in force is never
edited, a date into an invoiced period is refused naming effective_from,
and 1.5 JPY is refused where an amount is in yen. A tenant's owner and
viewer get 403. Every write is in the audit trail as finance's."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from billing.models import ModelPrice, Plan, PriceBook, Subscription
from tenants.choices import Role
from tests.factories import make_finance_user, make_member, make_tenant

DEC = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def fran(db):
    return make_finance_user(username="fran")


@pytest.fixture
def finance(client, fran):
    assert not fran.is_staff
    client.force_login(fran)
    return client


def _copy(page) -> dict:
    """The new-version form's fields as the page fills them (a copy)."""
    context = page.context
    data = {name: value for name, _, value in context["fee_fields"]}
    for n, row in enumerate(context["rows"]):
        data[f"prices.{n}.served_model"] = row["model"]
        data |= dict(row["fields"])
    return data


def test_finance_starts_a_new_version_from_a_date_with_a_copy_of_the_prices(world, finance, fran):
    v1 = world.price(per_gpu_second="0.0002").book
    listing = finance.get("/finance/prices/")
    assert listing.status_code == 200
    assert 'href="/finance/prices/"' in listing.content.decode()  # in the navigation
    [group] = listing.context["books"]
    assert [(b.version, b.status) for b in group["versions"]] == [(1, "in_force")]

    page = finance.get(f"/finance/prices/{v1.pk}/")
    assert page.status_code == 200
    copy = _copy(page)
    assert copy["prices.0.output_per_mtok"] == "4" and copy["prices.0.per_gpu_second"] == "0.0002"

    form = copy | {
        "action": "new_version",
        "effective_day": "2026-12-01",
        "effective_hour": "0",
        "prices.0.output_per_mtok": "4.50",
    }
    made = finance.post(f"/finance/prices/{v1.pk}/", form)

    assert made.status_code == 302, made.content.decode()[:2000]
    v2 = PriceBook.objects.get(name="list", version=2)
    assert made.url == f"/finance/prices/{v2.pk}/"
    price = ModelPrice.objects.get(book=v2)
    assert (price.output_per_mtok, price.input_per_mtok, price.per_gpu_second) == (
        Decimal("4.5"),
        1,
        Decimal("0.0002"),
    )
    v1.refresh_from_db()
    assert v1.effective_to == DEC
    statuses = {
        b.version: b.status for b in finance.get("/finance/prices/").context["books"][0]["versions"]
    }
    assert statuses == {1: "in_force", 2: "scheduled"}
    [insert] = AuditEntry.objects.filter(table="billing_pricebook", row_id=str(v2.pk))
    assert (insert.actor, insert.actor_user_id, insert.via) == ("fran", fran.pk, "session")


def test_a_version_in_force_is_never_edited_and_a_date_in_a_closed_period_is_refused(
    issued, finance
):
    v1 = PriceBook.objects.get(name="list")
    page = finance.get(f"/finance/prices/{v1.pk}/")
    assert "never edited" in page.content.decode()
    assert 'data-testid="withdraw-form"' not in page.content.decode()

    refused = finance.post(f"/finance/prices/{v1.pk}/", {"action": "withdraw"})
    assert refused.status_code == 409
    assert "list v1 is in force since" in refused.context["errors"]["message"]
    assert "create a new version from a date" in refused.context["errors"]["message"]

    form = _copy(page) | {"action": "new_version", "effective_day": "2026-10-15"}
    closed = finance.post(f"/finance/prices/{v1.pk}/", form)
    assert closed.status_code == 409
    shown = closed.content.decode()
    assert "effective_from: 2026-10-15 00:00 UTC is inside the closed period" in shown
    assert "invoiced up to 2026-11-01 00:00 UTC" in shown

    bad = finance.post(
        f"/finance/prices/{v1.pk}/",
        form | {"effective_day": "2026-12-01", "prices.0.output_per_mtok": "1,50"},
    )
    assert bad.status_code == 400
    assert bad.context["errors"]["field"] == "prices.0.output_per_mtok"
    assert PriceBook.objects.filter(name="list").count() == 1
    v1.refresh_from_db()
    assert v1.effective_to is None


def test_finance_adds_plans_in_two_currencies_and_yen_are_whole(db, finance):
    refused = finance.post(
        "/finance/prices/",
        {"action": "plan", "name": "Yen", "currency": "JPY", "minimum_commit": "1.5"},
    )
    assert refused.status_code == 400
    assert "minimum_commit: JPY has 0 decimal places" in refused.content.decode()
    for name, currency, commit in (("Yen", "JPY", "50000"), ("Dollar", "USD", "499.99")):
        added = finance.post(
            "/finance/prices/",
            {"action": "plan", "name": name, "currency": currency, "minimum_commit": commit},
        )
        assert added.status_code == 302, added.content.decode()[:2000]
    assert {(p.name, p.currency, str(p.minimum_commit)) for p in Plan.objects.all()} == {
        ("Yen", "JPY", "50000.0000"),
        ("Dollar", "USD", "499.9900"),
    }


def test_finance_moves_a_tenant_to_a_plan_from_a_date_and_edits_its_policy(db, finance, fran):
    tenant = make_tenant(name="Nippon", billing_currency="JPY")
    old = Plan.objects.create(name="Old", currency="JPY")
    new = Plan.objects.create(name="New", currency="JPY", minimum_commit=50_000)
    current = Subscription.objects.create(
        tenant=tenant, plan=old, start=datetime(2026, 9, 1, tzinfo=UTC)
    )
    path = f"/finance/tenants/{tenant.slug}/terms/"
    assert finance.get(path).status_code == 200

    past = finance.post(path, {"action": "move", "plan": new.pk, "effective_day": "2026-11-01"})
    assert past.status_code == 409
    assert "before the current hour" in past.context["errors"]["message"]
    moved = finance.post(
        path,
        {"action": "move", "plan": new.pk, "effective_day": "2026-12-01", "effective_hour": "0"},
    )
    assert moved.status_code == 302, moved.content.decode()[:2000]
    current.refresh_from_db()
    assert current.end == DEC
    assert Subscription.objects.get(tenant=tenant, plan=new).start == DEC

    policy = {"action": "policy", "monthly_budget": "1.5", "requests_per_minute": "60"}
    refused = finance.post(path, policy)
    assert refused.status_code == 400
    assert refused.context["errors"]["field"] == "monthly_budget"
    saved = finance.post(path, policy | {"monthly_budget": "20000"})
    assert saved.status_code == 302, saved.content.decode()[:2000]
    tenant.policy.refresh_from_db()
    assert (tenant.policy.monthly_budget, tenant.policy.requests_per_minute) == (20000, 60)
    entry = AuditEntry.objects.filter(table="tenants_tenantpolicy", tenant_id=tenant.pk).last()
    assert (entry.actor, entry.actor_user_id, entry.via) == ("fran", fran.pk, "session")


@pytest.mark.parametrize("role", [Role.OWNER, Role.VIEWER])
def test_a_tenants_members_cannot_reach_the_prices_pages(world, client, role):
    book = world.price().book
    client.force_login(make_member(world.a, role).user)
    for path, body in (
        ("/finance/prices/", {"action": "plan", "name": "Mine"}),
        (f"/finance/prices/{book.pk}/", {"action": "withdraw"}),
        (f"/finance/tenants/{world.a.slug}/terms/", {"action": "policy", "monthly_budget": "1"}),
    ):
        assert client.get(path).status_code == 403
        assert client.post(path, body).status_code == 403
    assert not Plan.objects.exists() and PriceBook.objects.filter(pk=book.pk).exists()
