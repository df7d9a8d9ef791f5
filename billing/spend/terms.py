"""What a tenant's spend is held to, for the gateway: the
accounts a request's worst case must fit in, and how to price it.

Two accounts, either or both:

- budget: the hard limit of the monthly budget, against what the current
  billing period has spent so far;
- prepaid: the credit the tenant's wallet holds now (a plan that is
  `prepaid`), against what its usage since the last invoiced period has
  spent (finalizing an invoice draws that usage from the wallet's grants,
  so the account starts again from the invoiced period's end).

Spent is what budgets count (billing.spend.budgets: tokens and
GPU-seconds less the plan's discount; fixed fees are known in advance and
drawn at invoicing), rated by the same code as invoices, from the hourly
rollups. With the accounts: each priced model's rate card in the book in
force and the period's volume of it so far, so that `usage_amount` prices
a request where its graduated tiers stand.

An account is named by `account_key`: the tenant, the kind and the moment
its spend counts from, so a new billing period (or an invoiced one) starts
a new account at its boundary. `account_spend` re-derives an account's
spend from the ledger up to a cut, for the correction job."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from functools import cached_property

from django.db.models import Max, Min

from billing.choices import InvoiceStatus
from billing.money import from_minor
from billing.pricing.periods import subscriptions_at, tenant_period
from billing.pricing.rate_card import RateCard, usage_counts
from billing.pricing.rating import price_books, rating_inputs, rating_session
from billing.spend.accounts import Limit
from billing.spend.budgets import budget_spend
from billing.spend.wallet import grant_in_force, wallet_balances
from metering.selectors.rating import usage_hours_span
from tenants.models import Tenant

HUNDRED = Decimal(100)
BUDGET, PREPAID = "budget", "prepaid"
# What finalizing has drawn from the wallet: these invoices' periods are settled.
INVOICED = (InvoiceStatus.FINALIZED, InvoiceStatus.PAID, InvoiceStatus.UNCOLLECTIBLE)
MAX_UNBILLED_PERIODS = 24  # how far back an uninvoiced prepaid tenant's usage is looked for


@dataclass(frozen=True)
class SpendAccount:
    kind: str  # BUDGET | PREPAID
    key: str  # account_key(...)
    since: datetime  # spend counts usage received from here
    limit: Decimal  # the hard budget, or the wallet's credit
    spent: Decimal  # since `since`, by the ledger: the fast account's seed


@dataclass(frozen=True)
class SpendTerms:
    tenant_id: int
    period_start: datetime
    period_end: datetime
    currency: str
    accounts: tuple[SpendAccount, ...]
    cards: dict[str, RateCard]  # served model name -> its prices in the book in force
    volume: dict[str, dict[str, int]]  # served model name -> token kind -> tokens so far
    discount_percent: Decimal = Decimal(0)  # the plan's discount on usage

    @cached_property
    def limits(self) -> tuple[Limit, ...]:
        """Its accounts as the spend accounts hold them (made once per terms)."""
        return tuple(Limit(a.key, a.limit, a.spent) for a in self.accounts)

    @cached_property
    def account_keys(self) -> tuple[str, ...]:
        return tuple(a.key for a in self.accounts)


def account_key(*, tenant_id: int, kind: str, since: datetime) -> str:
    return f"t{tenant_id}:{kind}:{since:%Y%m%dT%H%M%S}"


def spend_terms(*, tenant: Tenant, now: datetime) -> SpendTerms | None:
    """The tenant's terms at `now`; None when it has no budget and no
    prepaid plan to hold it to."""
    policy = tenant.policy
    subscription = subscriptions_at(tenant_ids=[tenant.pk], moment=now).get(tenant.pk)
    prepaid = subscription is not None and subscription.plan.prepaid
    if policy.monthly_budget is None and not prepaid:
        return None
    with rating_session():  # the books read once, for the cards and the spends
        return _terms(tenant, policy, subscription, now, prepaid=prepaid)


def _terms(tenant: Tenant, policy, subscription, now: datetime, *, prepaid: bool) -> SpendTerms:
    start, end = tenant_period(tenant=tenant, moment=now)
    inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
    books = price_books(
        tier=tenant.tier,
        tiers=inputs.tiers or None,
        currency=tenant.billing_currency,
        start=start,
        end=end,
    )
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
    period_spent = budget_spend(tenant=tenant, start=start, end=end, inputs=inputs)
    accounts = []
    if policy.monthly_budget is not None:
        accounts.append(
            SpendAccount(
                kind=BUDGET,
                key=account_key(tenant_id=tenant.pk, kind=BUDGET, since=start),
                since=start,
                limit=policy.monthly_budget * policy.budget_hard_percent / HUNDRED,
                spent=period_spent,
            )
        )
    if prepaid:
        since = unbilled_since(tenant=tenant)
        if since < start:  # earlier periods not invoiced yet, then this one (rated above)
            spent = account_spend(tenant=tenant, since=since, cut=start) + period_spent
        else:  # this period is the first unbilled one (or was invoiced early)
            spent = period_spent if since == start else Decimal(0)
        accounts.append(
            SpendAccount(
                kind=PREPAID,
                key=account_key(tenant_id=tenant.pk, kind=PREPAID, since=since),
                since=since,
                limit=prepaid_credit(tenant=tenant, now=now),
                spent=spent,
            )
        )
    return SpendTerms(
        tenant_id=tenant.pk,
        period_start=start,
        period_end=end,
        currency=tenant.billing_currency,
        accounts=tuple(accounts),
        cards=cards,
        volume={name: dict(kinds) for name, kinds in volume.items()},
        discount_percent=subscription.plan.discount_percent if subscription else Decimal(0),
    )


def prepaid_credit(*, tenant: Tenant, now: datetime) -> Decimal:
    """What the wallet holds now in the tenant's currency: its grants
    granted by `now` and not expired, less what invoices have drawn."""
    currency = tenant.billing_currency
    minor = sum(
        b.remaining_minor
        for b in wallet_balances(tenant=tenant)
        if b.grant.currency == currency and grant_in_force(b.grant, now)
    )
    return from_minor(minor, currency)


def unbilled_since(*, tenant: Tenant) -> datetime:
    """Where the usage that no invoice has drawn from the wallet begins: the
    end of the last invoiced period, or the first subscription's first
    period."""
    invoiced = tenant.invoices.filter(status__in=INVOICED).aggregate(end=Max("period_end"))["end"]
    if invoiced is not None:
        return invoiced
    first = tenant.subscriptions.aggregate(start=Min("start"))["start"]
    return tenant_period(tenant=tenant, moment=first)[0]


def account_spend(*, tenant: Tenant, since: datetime, cut: datetime) -> Decimal:
    """The usage received in [since, cut) rated period by period (each its
    own volume tiers), as budgets count it: an account's spend by the ledger.
    Only the periods from its first to its last hour of usage there are
    rated (usage is all budgets count: one without any spent nothing)."""
    span = usage_hours_span(tenant_id=tenant.pk, start=since, end=cut)
    if span is None:
        return Decimal(0)
    spent = Decimal(0)
    moment = tenant_period(tenant=tenant, moment=max(since, span[0]))[0]
    moment, last = max(moment, since), span[1]
    for _ in range(MAX_UNBILLED_PERIODS):
        if moment >= cut or moment > last:
            break
        start, end = tenant_period(tenant=tenant, moment=moment)
        spent += budget_spend(tenant=tenant, start=start, end=min(end, cut))
        moment = end
    return spent
