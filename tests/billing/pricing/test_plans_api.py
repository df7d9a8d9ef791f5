"""Plans, subscriptions and tenant policies through finance's API (issue 59,
item 6): a plan a started subscription uses is never edited (409); a move
to another plan from a date ends the subscription in force there and
starts the new one, refused (409) before the current hour or into an
invoiced period; a plan's commitment and a budget keep their currency's
minor units (1.5 JPY refused); a policy is checked as the admin checks
it. Writes are audited with who made them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from audit.models import AuditEntry
from billing.errors import PlanInUseError
from billing.models import Plan, Subscription
from tests.conftest import client_for_user
from tests.factories import make_finance_user, make_tenant

PLANS = "/api/v1/plans"
DEC = datetime(2026, 12, 1, tzinfo=UTC)


@pytest.fixture
def fran(db):
    return make_finance_user(username="fran")


@pytest.fixture
def finance(fran):
    return client_for_user(fran)


def test_a_plan_in_use_is_never_edited_and_a_tenant_moves_to_a_new_one_from_a_date(
    world, finance, fran
):
    old = Plan.objects.create(name="Committed", minimum_commit=500)
    current = Subscription.objects.create(
        tenant=world.a, plan=old, anchor_day=5, start=datetime(2026, 9, 5, tzinfo=UTC)
    )

    refused = finance.patch(f"{PLANS}/{old.pk}", {"minimum_commit": "600"}, format="json")
    assert refused.status_code == 409, refused.json()
    assert refused.json()["error"]["code"] == "plan_in_use"
    assert "create a new plan and move the subscriptions" in refused.json()["error"]["message"]
    old.minimum_commit = 600
    with pytest.raises(PlanInUseError):
        old.save()

    new = finance.post(PLANS, {"name": "Committed 2027", "minimum_commit": "600"}, format="json")
    assert new.status_code == 201, new.json()
    assert new.json()["started"] == 0
    path = f"/api/v1/tenants/{world.a.slug}/subscriptions"
    moved = finance.post(
        path, {"plan": new.json()["id"], "effective_from": "2026-12-05"}, format="json"
    )

    assert moved.status_code == 201, moved.json()
    assert moved.json()["anchor_day"] == 5 and moved.json()["plan"] == "Committed 2027"
    current.refresh_from_db()
    assert current.end == datetime(2026, 12, 5, tzinfo=UTC)
    listed = finance.get(path).json()
    assert [(s["plan"], s["end"]) for s in listed] == [
        ("Committed 2027", None),
        ("Committed", "2026-12-05T00:00:00Z"),
    ]
    # Not yet started: its plan may still change, and the move be withdrawn.
    edited = finance.patch(f"{PLANS}/{new.json()['id']}", {"discount_percent": "5"}, format="json")
    assert edited.status_code == 200, edited.json()
    assert finance.delete(f"{path}/{moved.json()['id']}").status_code == 204
    current.refresh_from_db()
    assert current.end is None
    assert finance.delete(f"{path}/{current.pk}").status_code == 409

    entry = AuditEntry.objects.filter(table="billing_subscription", row_id=str(current.pk)).last()
    assert (entry.action, entry.actor, entry.actor_user_id) == ("update", "fran", fran.pk)


def test_a_move_before_the_current_hour_or_into_an_invoiced_period_is_409(issued, finance):
    plan = finance.post(PLANS, {"name": "Gold"}, format="json").json()
    path = f"/api/v1/tenants/{issued['draft'].tenant.slug}/subscriptions"
    for day, code in (("2026-10-20", "price_period_closed"), ("2026-11-20", "terms_backdated")):
        answer = finance.post(path, {"plan": plan["id"], "effective_from": day}, format="json")
        assert answer.status_code == 409, answer.json()
        assert answer.json()["error"]["code"] == code
        assert answer.json()["error"]["message"].startswith(f"effective_from: {day} 00:00 UTC")
    assert not Subscription.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "Yen", "currency": "JPY", "minimum_commit": "1.5"}, "minimum_commit"),
        ({"name": "Pct", "discount_percent": "1e1"}, "discount_percent"),
        ({"name": "Pct", "discount_percent": "101"}, "discount_percent"),
        ({"name": "Cur", "currency": "XYZ"}, "currency"),
        ({"name": "Odd", "prepay": True}, "prepay"),
    ],
)
def test_a_bad_plan_is_a_400_naming_the_field(finance, body, field):
    answer = finance.post(PLANS, body, format="json")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"]["field"] == field
    assert not Plan.objects.exists()


def test_a_yen_plan_takes_whole_yen(finance):
    answer = finance.post(
        PLANS, {"name": "Yen", "currency": "JPY", "minimum_commit": "50,000"}, format="json"
    )
    assert answer.status_code == 201, answer.json()
    assert Plan.objects.get(name="Yen").minimum_commit == 50_000


def test_finance_edits_a_tenants_policy_checked_as_the_admin_checks_it(db, finance, fran):
    yen = make_tenant(name="Nippon", billing_currency="JPY")
    dollar = make_tenant(name="Dollar")
    path = f"/api/v1/tenants/{yen.slug}/policy"

    for body, field in (
        ({"monthly_budget": "1.5"}, "monthly_budget"),
        ({"budget_soft_percent": 90, "budget_hard_percent": 80}, "budget_soft_percent"),
        ({"queue_timeout_ms": 10_000_000}, "queue_timeout_ms"),
        ({"priority_class": "urgent"}, "priority_class"),
        ({"max_concurrency": 3}, "max_concurrency"),
    ):
        answer = finance.patch(path, body, format="json")
        assert answer.status_code == 400, (body, answer.json())
        assert answer.json()["error"]["field"] == field

    changed = finance.patch(
        path, {"monthly_budget": "15000", "requests_per_minute": 120}, format="json"
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["monthly_budget"] == "15000.0000"
    assert finance.get(path).json()["requests_per_minute"] == 120
    dollar_path = f"/api/v1/tenants/{dollar.slug}/policy"
    assert finance.patch(dollar_path, {"monthly_budget": "1.50"}, format="json").status_code == 200
    assert finance.get(dollar_path).json()["requests_per_minute"] is None  # the other untouched

    entry = AuditEntry.objects.filter(table="tenants_tenantpolicy", tenant_id=yen.pk).last()
    assert (entry.action, entry.actor, entry.actor_user_id, entry.via) == (
        "update",
        "fran",
        fran.pk,
        "session",
    )
    assert set(entry.changed) >= {"monthly_budget", "requests_per_minute"}
