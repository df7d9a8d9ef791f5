"""Budgets: the soft threshold emails the owners and admins once per
period; the hard one blocks the tenant at the gateway with a message
naming the budget, until a raise or the next period. End to end through
the real gateway and vLLM at the bottom."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core import mail

from billing.models import BudgetState, ModelPrice, PriceBook
from billing.spend.budgets import budget_check, budgets_check
from gateway.callers import CallerRefused, caller_load
from tenants.choices import Role
from tenants.models import Tenant, TenantPolicy
from tests.billing.conftest import NOV, OCT
from tests.factories import make_key, make_member
from webhooks.models import Event

NOW = OCT + timedelta(days=20)


def _budget(tenant, amount, soft=50, hard=100):
    TenantPolicy.objects.filter(tenant=tenant).update(
        monthly_budget=Decimal(amount), budget_soft_percent=soft, budget_hard_percent=hard
    )


def _spend(world, tenant, dollars: int, day: int = 3):
    """$4 per million output tokens."""
    world.tokens(tenant, hour=OCT + timedelta(days=day), completion=dollars * 250_000)


@pytest.fixture
def priced(world):
    world.price()
    make_member(world.a, Role.OWNER, email="owner@alpha.test")
    make_member(world.a, Role.ADMIN, email="admin@alpha.test")
    make_member(world.a, Role.VIEWER, email="viewer@alpha.test")
    return world


@pytest.fixture
def check(django_capture_on_commit_callbacks):
    """budget_check / budgets_check, with what they do after commit (email) done."""

    def run(fn=None, **kwargs):
        with django_capture_on_commit_callbacks(execute=True):
            return (fn or budget_check)(**kwargs)

    return run


def test_the_soft_threshold_emails_owners_and_admins_once(priced, check):
    world = priced
    _budget(world.a, 100)
    _spend(world, world.a, 60)
    _spend(world, world.b, 500)  # Bravo has no budget: never checked

    checks = check(budgets_check, now=NOW)
    check(budgets_check, now=NOW + timedelta(minutes=1))

    assert [(c.tenant, c.spend, c.notified_soft) for c in checks] == [
        (world.a.slug, Decimal(60), True)
    ]
    assert len(mail.outbox) == 1
    assert sorted(mail.outbox[0].to) == ["admin@alpha.test", "owner@alpha.test"]
    assert "60.0% of the monthly budget used (past the 50% alert threshold)" in (
        mail.outbox[0].subject
    )
    assert "60.00 USD of a 100 USD" in mail.outbox[0].body
    state = BudgetState.objects.get(tenant=world.a)
    assert state.spend == 60 and state.period_start == OCT and state.period_end == NOV


def test_the_alert_says_the_share_used_and_the_threshold_crossed(priced, check):
    """50% used past a 10% threshold reads "50.0% ... used (past the 10%
    ...)", never "10% used": in the email and in the webhook event, for a
    USD tenant and a JPY one (no minor units: 5,000 JPY, not 5000.00)."""
    world = priced
    Tenant.objects.filter(pk=world.b.pk).update(billing_currency="JPY")
    world.b.refresh_from_db()
    book = PriceBook.objects.create(name="list-jpy", currency="JPY", effective_from=OCT)
    prices = {f"{k}_per_mtok": Decimal(400) for k in ("input", "cached_input", "output")}
    ModelPrice.objects.create(book=book, served_model=world.model, **prices)
    make_member(world.b, Role.OWNER, email="owner@bravo.test")
    _budget(world.a, 100, soft=10)
    _budget(world.b, 10_000, soft=10)
    _spend(world, world.a, 50)  # 50 USD at $4 per million
    world.tokens(world.b, hour=OCT + timedelta(days=3), completion=12_500_000)  # 5,000 JPY

    check(budgets_check, now=NOW)

    sent = {to: m for m in mail.outbox for to in m.to}
    for to, amount, limit, tenant in (
        ("owner@alpha.test", "50.00 USD", "100 USD", world.a),
        ("owner@bravo.test", "5,000 JPY", "10000 JPY", world.b),
    ):
        summary = f"{tenant.name}: 50.0% of the monthly budget used (past the 10% alert threshold)"
        assert sent[to].subject == summary
        assert f"{amount} of a {limit} monthly budget (50.0%)" in sent[to].body
        event = Event.objects.get(tenant=tenant, type="budget.threshold_crossed")
        assert event.summary == summary and "10% of the monthly budget used" not in summary
        assert (event.data["used_percent"], event.data["percent"]) == ("50.0", 10)
    assert Event.objects.get(tenant=world.b).data["spend"] == "5000"
    assert Event.objects.get(tenant=world.a).data["spend"] == "50.00"


def test_the_hard_threshold_blocks_until_the_budget_is_raised(priced, check, monkeypatch):
    # caller_load runs in the gateway's own thread and connection; here it
    # shares the test's transaction, which it must not close.
    monkeypatch.setattr("django.db.close_old_connections", lambda: None)
    world = priced
    _budget(world.a, 100, hard=90)
    _, secret = make_key(world.a)
    _spend(world, world.a, 95)

    assert check(tenant=world.a, now=NOW).blocked
    with pytest.raises(CallerRefused) as refused:
        caller_load(secret)
    assert refused.value.status == 402 and refused.value.code == "budget_exceeded"
    assert "monthly budget of 100 USD reached (95.00 USD spent" in refused.value.message
    assert "until 2026-11-01" in refused.value.message
    assert [m.subject for m in mail.outbox] == [f"{world.a.name}: monthly budget reached"]

    _budget(world.a, 200, hard=90)
    assert budget_check(tenant=world.a, now=NOW).unblocked
    assert caller_load(secret).tenant_id == world.a.pk


def test_a_new_period_lifts_the_block(priced):
    world = priced
    _budget(world.a, 10)
    _spend(world, world.a, 20)
    assert budget_check(tenant=world.a, now=NOW).blocked

    november = budget_check(tenant=world.a, now=NOV + timedelta(hours=2))

    assert november.unblocked and november.spend == 0
    assert TenantPolicy.objects.get(tenant=world.a).budget_blocked_at is None
    assert BudgetState.objects.filter(tenant=world.a).count() == 2


def test_removing_the_budget_lifts_the_block(priced):
    world = priced
    _budget(world.a, 10)
    _spend(world, world.a, 20)
    budget_check(tenant=world.a, now=NOW)
    TenantPolicy.objects.filter(tenant=world.a).update(monthly_budget=None)

    (check,) = budgets_check(now=NOW)

    assert check.unblocked and check.budget is None


@pytest.mark.django_db(transaction=True)
def test_the_gateway_holds_the_hard_budget_per_request(fleet, vllm, settings):
    """Real requests through the gateway: each reserves its worst case (16
    output tokens at $1 per thousand) against what is left of the budget,
    so the fourth is refused with a 402 naming what is left before it runs,
    and the spend the ledger rates afterwards never passes the budget."""
    import openai

    from billing.models import ModelPrice, PriceBook
    from tests.fleet import metering_run_all, wait_for_records_written

    settings.METERING = {**settings.METERING, "ATTRIBUTION_GRACE_SECONDS": 0}
    tenant = fleet.add_tenant("spender")
    fleet.add_replica("alpha", vllm["alpha"].base_url, "shared")
    fleet.ready()
    book = PriceBook.objects.create(
        name="steep", effective_from=datetime(2026, 1, 1, tzinfo=UTC)
    )  # $1 per thousand output tokens
    ModelPrice.objects.create(
        book=book,
        served_model=fleet.model,
        input_per_mtok=0,
        cached_input_per_mtok=0,
        output_per_mtok=Decimal(1000),
    )
    _budget(tenant, "0.05")  # 50 output tokens
    client = fleet.client("spender")

    def ask():
        return client.chat.completions.create(
            model=fleet.model.name,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=16,
            extra_body={"ignore_eos": True},
        )

    for _ in range(3):
        ask()  # 0.016 each
    with pytest.raises(openai.APIStatusError) as refused:
        ask()
    assert refused.value.status_code == 402
    assert refused.value.body["code"] == "budget_exceeded"
    assert "0.002 USD left of 0.05" in refused.value.message
    assert "may cost up to 0.016 USD" in refused.value.message
    wait_for_records_written(fleet.gateway)
    metering_run_all()

    check = budget_check(tenant=tenant)

    assert check.spend == Decimal("0.048") and not check.blocked  # under the budget
