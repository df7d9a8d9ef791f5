"""Spend control's API and pages at their edges: an unknown tenant is a
400 naming the field (no grant written); raising a blocked tenant's budget
unblocks it at once; the standing falls back to the ledger when Redis is
unreachable; and drift is reported once per tenant and kind of account,
the latest period's, not once per account the tenant ever had."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client

from billing.models import CreditGrant, SpendCorrection
from billing.spend.balances import spend_standing
from billing.spend.corrections import spend_drift_latest
from tenants.models import Tenant, TenantPolicy
from tenants.services import policy_budget_block
from tests.factories import make_finance_user, make_tenant

pytestmark = pytest.mark.django_db
D = Decimal


@pytest.fixture
def finance():
    client = Client()
    client.force_login(make_finance_user())
    return client


def test_credit_for_an_unknown_tenant_is_a_400_naming_it(finance):
    answer = finance.post(
        "/api/v1/credit-grants",
        {"tenant": "nobody", "amount": "5"},
        content_type="application/json",
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["field"] == "tenant"
    assert not CreditGrant.objects.exists()


def test_credit_in_another_currency_than_the_tenants_is_a_400_naming_it(finance):
    tenant = make_tenant(name="Euro", billing_currency="EUR")
    answer = finance.post(
        "/api/v1/credit-grants",
        {"tenant": tenant.slug, "amount": "5", "currency": "usd"},
        content_type="application/json",
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["field"] == "currency" and "EUR" in error["message"]
    assert not CreditGrant.objects.exists()  # it would never have counted
    answer = finance.post(
        "/api/v1/credit-grants",
        {"tenant": tenant.slug, "amount": "5", "currency": "eur"},
        content_type="application/json",
    )
    assert answer.status_code == 201
    assert CreditGrant.objects.get().currency == "EUR"


def test_raising_a_blocked_tenants_budget_unblocks_it_at_once(finance):
    tenant = make_tenant(name="Blocked")
    TenantPolicy.objects.filter(tenant=tenant).update(monthly_budget=D("0"))
    policy_budget_block(tenant=tenant, message="monthly budget reached")
    assert TenantPolicy.objects.get(tenant=tenant).budget_blocked_at is not None

    answer = finance.put(
        f"/api/v1/tenants/{tenant.slug}/budget",
        {"monthly_budget": "100"},
        content_type="application/json",
    )
    assert answer.status_code == 200, answer.content
    assert TenantPolicy.objects.get(tenant=tenant).budget_blocked_at is None


def test_the_standing_is_the_ledgers_when_redis_is_unreachable(settings):
    tenant = make_tenant(name="Capped")
    TenantPolicy.objects.filter(tenant=tenant).update(
        monthly_budget=D("10"), budget_hard_percent=100
    )
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there
    (standing,) = spend_standing(tenant=Tenant.objects.get(pk=tenant.pk), now=datetime.now(UTC))
    assert (standing.kind, standing.limit, standing.live) == ("budget", D("10"), False)
    assert standing.reserved is None  # not known, rather than nothing


def test_drift_is_the_latest_per_tenant_and_kind():
    tenant = make_tenant(name="Two periods")
    for account, cut, drift in (
        ("t:budget:20261001T000000", datetime(2026, 10, 31, 23, tzinfo=UTC), D("0.5")),
        ("t:budget:20261101T000000", datetime(2026, 11, 20, 10, tzinfo=UTC), D("0.1")),
    ):
        SpendCorrection.objects.create(
            tenant=tenant,
            account=account,
            kind="budget",
            cut=cut,
            ledger=D(1),
            drift=drift,
            applied_at=cut,
        )
    (latest,) = spend_drift_latest(applied=True)
    assert (latest.account, latest.drift) == ("t:budget:20261101T000000", D("0.1"))
