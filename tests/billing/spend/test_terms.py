"""The terms the gateway holds a tenant's spend to: the hard limit of its
budget, what the ledger says it has spent this period (rated as invoices
rate it), the rate card of each model the book in force prices and the
period's volume of it, so the next request is priced where its tiers stand."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize
from billing.models import CreditApplication, CreditGrant, Plan, Subscription, VolumeTier
from billing.pricing.rate_card import usage_amount
from billing.spend.terms import spend_terms
from tenants.models import TenantPolicy
from tests.billing.conftest import NOV, OCT, charges_rate

D = Decimal


def test_no_budget_no_terms(world):
    world.price()
    assert spend_terms(tenant=world.a, now=OCT + timedelta(days=3)) is None


def test_terms_name_the_limit_the_ledgers_spend_and_where_the_tiers_stand(world):
    price = world.price()
    for start, per_mtok in ((0, "4"), (1_000_000, "3")):
        VolumeTier.objects.create(
            model_price=price, kind="output", from_tokens=start, per_mtok=D(per_mtok)
        )
    TenantPolicy.objects.filter(tenant=world.a).update(
        monthly_budget=D("20"), budget_hard_percent=90
    )
    world.a.refresh_from_db()
    world.tokens(world.a, hour=OCT + timedelta(hours=5), prompt=1_500_000, cached=500_000)
    world.tokens(world.a, hour=OCT + timedelta(days=2), completion=999_000)
    world.tokens(world.b, hour=OCT + timedelta(hours=5), prompt=9_000_000)  # not Alpha's

    terms = spend_terms(tenant=world.a, now=OCT + timedelta(days=3))

    assert (terms.period_start, terms.period_end, terms.currency) == (OCT, NOV, "USD")
    (account,) = terms.accounts  # no prepaid plan: the budget alone
    assert (account.kind, account.since, account.key) == (
        "budget",
        OCT,
        f"t{world.a.pk}:budget:20261001T000000",
    )
    assert account.limit == D("18")  # 90% of 20
    # 1 M input at $1/M, 0.5 M cached at $0.25/M, 0.999 M output at $4/M
    assert account.spent == D("1") + D("0.125") + D("3.996")
    model = world.model.name
    assert terms.volume == {model: {"input": 1_000_000, "cached_input": 500_000, "output": 999_000}}
    # The next 2,000 output tokens: 1,000 left at $4/M, then $3/M, as invoices rate them.
    before = sum(c.amount for c in charges_rate(tenant=world.a, start=OCT, end=NOV))
    world.tokens(world.a, hour=OCT + timedelta(days=3), completion=2_000)
    after = sum(c.amount for c in charges_rate(tenant=world.a, start=OCT, end=NOV))
    priced = usage_amount(terms.cards[model], done=terms.volume[model], prompt=0, completion=2_000)
    assert priced == D("0.007") == after - before


SEP = datetime(2026, 9, 1, tzinfo=UTC)


def test_a_prepaid_tenants_balance_is_its_credit_less_usage_not_yet_invoiced(world):
    world.price(since=SEP)
    plan = Plan.objects.create(name="Prepaid", prepaid=True)
    Subscription.objects.create(tenant=world.a, plan=plan, start=SEP)
    CreditGrant.objects.create(tenant=world.a, amount=D("10"), granted_at=SEP)
    expiring = CreditGrant.objects.create(  # expired by now: not spendable
        tenant=world.a, amount=D("5"), granted_at=SEP, expires_at=OCT + timedelta(days=1)
    )
    CreditGrant.objects.create(tenant=world.a, amount=D("7"), currency="EUR", granted_at=SEP)
    CreditGrant.objects.create(  # granted later than now
        tenant=world.a, amount=D("3"), granted_at=OCT + timedelta(days=9)
    )
    world.tokens(world.a, hour=SEP + timedelta(days=3), completion=500_000)  # 2.00
    world.tokens(world.a, hour=OCT + timedelta(days=1), completion=250_000)  # 1.00
    now = OCT + timedelta(days=3)

    (account,) = spend_terms(tenant=world.a, now=now).accounts  # no budget: prepaid alone
    assert (account.kind, account.since) == ("prepaid", SEP)  # September is not invoiced
    assert (account.limit, account.spent) == (D("10"), D("3"))

    # September invoiced: its 2.00 drawn from the grant that expires first
    # (it was good in September), so the account starts again in October.
    draft, _ = invoice_draft_build(tenant=world.a, period_start=SEP, period_end=OCT)
    invoice_finalize(invoice_id=draft.pk)
    assert CreditApplication.objects.get().grant == expiring
    (account,) = spend_terms(tenant=world.a, now=now).accounts
    assert (account.since, account.key) == (OCT, f"t{world.a.pk}:prepaid:20261001T000000")
    assert (account.limit, account.spent) == (D("10"), D("1"))
    # October invoiced (5.00): 3.00 from the expiring grant (good when October
    # began), 2.00 from the 10; the 3 granted on the 10th adds to the balance.
    world.tokens(world.a, hour=OCT + timedelta(days=2), completion=1_000_000)  # 4.00
    draft, _ = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)
    invoice_finalize(invoice_id=draft.pk, now=NOV + timedelta(days=1))
    (account,) = spend_terms(tenant=world.a, now=NOV + timedelta(days=1)).accounts
    assert (account.since, account.limit, account.spent) == (NOV, D("11"), D(0))


def test_a_prepaid_tenant_with_a_budget_is_held_to_both(world):
    world.price()
    plan = Plan.objects.create(name="Prepaid", prepaid=True, discount_percent=D("10"))
    Subscription.objects.create(tenant=world.a, plan=plan, start=OCT)
    CreditGrant.objects.create(tenant=world.a, amount=D("4"), granted_at=OCT)
    TenantPolicy.objects.filter(tenant=world.a).update(monthly_budget=D("2"))
    world.a.refresh_from_db()
    world.tokens(world.a, hour=OCT + timedelta(days=1), completion=250_000)  # 1.00 less 10%
    terms = spend_terms(tenant=world.a, now=OCT + timedelta(days=3))
    assert [(a.kind, a.limit, a.spent) for a in terms.accounts] == [
        ("budget", D("2"), D("0.9")),
        ("prepaid", D("4"), D("0.9")),
    ]
    assert terms.discount_percent == D("10")


def test_unbilled_periods_before_any_usage_count_nothing_and_are_not_rated(world):
    """A prepaid tenant subscribed in July, never invoiced, whose usage
    began in September: July and August spent nothing, and the account's
    spend is September's and October's."""
    from unittest import mock

    import billing.spend.terms as terms_module

    july = datetime(2026, 7, 1, tzinfo=UTC)
    world.price(since=july)
    plan = Plan.objects.create(name="Prepaid", prepaid=True)
    Subscription.objects.create(tenant=world.a, plan=plan, start=july)
    CreditGrant.objects.create(tenant=world.a, amount=D("10"), granted_at=july)
    world.tokens(world.a, hour=SEP + timedelta(days=3), completion=500_000)  # 2.00
    world.tokens(world.a, hour=OCT + timedelta(days=1), completion=250_000)  # 1.00
    rated = []
    real = terms_module.budget_spend

    def budget_spend(**kwargs):
        rated.append(kwargs["start"])
        return real(**kwargs)

    with mock.patch.object(terms_module, "budget_spend", budget_spend):
        (account,) = spend_terms(tenant=world.a, now=OCT + timedelta(days=3)).accounts
    assert (account.since, account.spent) == (july, D("3"))
    assert sorted(rated) == [SEP, OCT]  # July and August not rated
