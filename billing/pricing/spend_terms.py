"""What a tenant's spend is held to, for the gateway (issue 18): its
current billing period, the hard limit of its budget, what it has spent so
far by the ledger (the seed of the gateway's fast account), and, for each
model the book in force prices, the model's rate card and the period's
volume of it so far, so that `usage_amount` prices a request where its
graduated tiers stand.

Spent is what budgets count (billing.pricing.budgets: tokens and
GPU-seconds less the plan's discount; fixed fees are known in advance and
not counted), rated by the same code as invoices, from the hourly rollups."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from billing.pricing.budgets import budget_spend
from billing.pricing.periods import tenant_period
from billing.pricing.rating import (
    RateCard,
    price_books,
    rating_inputs,
    rating_session,
    usage_counts,
)
from tenants.models import Tenant

HUNDRED = Decimal(100)


@dataclass(frozen=True)
class SpendTerms:
    tenant_id: int
    period_start: datetime
    period_end: datetime
    currency: str
    limit: Decimal  # the hard budget: monthly budget x hard threshold
    spent: Decimal  # this period so far, by the ledger
    cards: dict[str, RateCard]  # served model name -> its prices in the book in force
    volume: dict[str, dict[str, int]]  # served model name -> token kind -> tokens so far


def spend_terms(*, tenant: Tenant, now: datetime) -> SpendTerms | None:
    """The tenant's terms at `now`; None when it has no budget to hold."""
    policy = tenant.policy
    if policy.monthly_budget is None:
        return None
    with rating_session():  # the books read once, for the cards and the spend
        return _terms(tenant, policy, now)


def _terms(tenant: Tenant, policy, now: datetime) -> SpendTerms:
    start, end = tenant_period(tenant=tenant, moment=now)
    inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
    books = price_books(tier=tenant.tier, start=start, end=end)
    book = books.at(now)
    cards = {}
    if book is not None:
        for model_id in books.priced_models(book):
            price = books.price(book, model_id)
            cards[price.served_model.name] = books.card(book, model_id)
    volume: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for _, _, name, prompt, cached, completion, _, _ in inputs.usage:
        for kind, tokens in usage_counts(
            prompt=prompt, cached=cached, completion=completion
        ).items():
            volume[name][kind] += tokens
    return SpendTerms(
        tenant_id=tenant.pk,
        period_start=start,
        period_end=end,
        currency=tenant.billing_currency,
        limit=policy.monthly_budget * policy.budget_hard_percent / HUNDRED,
        spent=budget_spend(tenant=tenant, start=start, end=end, inputs=inputs),
        cards=cards,
        volume={name: dict(kinds) for name, kinds in volume.items()},
    )
