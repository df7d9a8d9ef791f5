"""The terms the gateway holds a tenant's spend to: the hard limit of its
budget, what the ledger says it has spent this period (rated as invoices
rate it), the rate card of each model the book in force prices and the
period's volume of it, so the next request is priced where its tiers stand."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from billing.models import VolumeTier
from billing.pricing.rating import charges_rate, usage_amount
from billing.pricing.spend_terms import spend_terms
from tenants.models import TenantPolicy
from tests.billing.conftest import NOV, OCT

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
    assert terms.limit == D("18")  # 90% of 20
    # 1 M input at $1/M, 0.5 M cached at $0.25/M, 0.999 M output at $4/M
    assert terms.spent == D("1") + D("0.125") + D("3.996")
    model = world.model.name
    assert terms.volume == {model: {"input": 1_000_000, "cached_input": 500_000, "output": 999_000}}
    # The next 2,000 output tokens: 1,000 left at $4/M, then $3/M, as invoices rate them.
    before = sum(c.amount for c in charges_rate(tenant=world.a, start=OCT, end=NOV))
    world.tokens(world.a, hour=OCT + timedelta(days=3), completion=2_000)
    after = sum(c.amount for c in charges_rate(tenant=world.a, start=OCT, end=NOV))
    priced = usage_amount(terms.cards[model], done=terms.volume[model], prompt=0, completion=2_000)
    assert priced == D("0.007") == after - before
