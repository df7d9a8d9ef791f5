"""A plan's terms as charges (billing.pricing.rating calls these): its
discount off usage and its minimum commitment's true-up, in the tenant's
currency (a plan in another is converted at the period's dated rate, the
line naming it); a plan moved inside the period, each plan for its own
stretch."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from typing import TYPE_CHECKING

from billing.money import amount_format, price_format
from billing.pricing.charge import Charge

if TYPE_CHECKING:
    from billing.pricing.rating import Books


def charges_plan(
    subscription, *, usage: list[Charge], fees: list[Charge], books: Books
) -> list[Charge]:
    if subscription is None:
        return []
    plan = subscription.plan
    out = []
    used = sum((c.amount for c in usage), Decimal(0))
    if plan.discount_percent and used:  # no usage: no 0.00 discount line
        discount = -used * plan.discount_percent / 100
        out.append(
            Charge(
                "discount",
                f"{plan.name}: {plan.discount_percent}% off usage",
                Decimal(1),
                None,
                discount,
            )
        )
    total = used + sum((c.amount for c in fees + out), Decimal(0))
    commit = books.convert(plan.minimum_commit, plan.currency)
    if total < commit:
        out.append(
            Charge(
                "commit_true_up",
                f"{plan.name}: minimum commitment {amount_format(commit, books.currency)}"
                + _commit_rate_note(plan, books),
                Decimal(1),
                None,
                commit - total,
            )
        )
    return out


def _commit_rate_note(plan, books: Books) -> str:
    """What a commitment in another currency than the tenant's says of its
    conversion: nothing when it is the tenant's, else the rate."""
    rate = books.rate(plan.currency)
    if rate is None:
        return ""
    return (
        f" ({price_format(plan.minimum_commit, plan.currency)} at "
        f"{rate.rate.normalize():f} {rate.base}/{rate.quote})"
    )


def charges_plans(
    plans: tuple,
    *,
    used_from: dict[datetime, Decimal],
    fees: list[Charge],
    books: Books,
    start: datetime,
    end: datetime,
) -> list[Charge]:
    """A period whose plan changed inside it: each plan's terms for its own
    stretch (invariant 9: priced under what was in force). Its discount
    takes off the usage of its stretch; its minimum commitment is prorated
    to the stretch's share of the period's hours and trued up against the
    stretch's usage, discount and share of the fees. One plan's stretches
    (moved away and back) are one line each; lines name their plan."""
    hours_total = Decimal((end - start) / timedelta(hours=1))
    fees_total = sum((c.amount for c in fees), Decimal(0))
    terms: dict[int, list] = {}  # plan id -> [plan, used, hours, stretches' dates]
    bounds = [since for since, _ in plans] + [end]
    for (since, subscription), until in zip(plans, bounds[1:], strict=True):
        plan = subscription.plan
        entry = terms.setdefault(plan.pk, [plan, Decimal(0), Decimal(0), []])
        entry[1] += sum((a for t, a in used_from.items() if since <= t < until), Decimal(0))
        entry[2] += Decimal((until - since) / timedelta(hours=1))
        entry[3].append(f"{since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M}")
    out = []
    for plan, used, hours, stretches in terms.values():
        when = f" ({', '.join(stretches)} UTC)"
        discount = -used * plan.discount_percent / 100 if plan.discount_percent and used else 0
        if discount:
            out.append(
                Charge(
                    "discount",
                    f"{plan.name}: {plan.discount_percent}% off usage" + when,
                    Decimal(1),
                    None,
                    discount,
                    book=plan.name,
                )
            )
        share = hours / hours_total
        commit = books.convert(plan.minimum_commit, plan.currency) * share
        total = used + discount + fees_total * share
        if total < commit:
            out.append(
                Charge(
                    "commit_true_up",
                    f"{plan.name}: minimum commitment {amount_format(commit, books.currency)}, "
                    f"{share:.1%} of {amount_format(plan.minimum_commit, plan.currency)}"
                    + _commit_rate_note(plan, books)
                    + when,
                    Decimal(1),
                    None,
                    commit - total,
                    book=plan.name,
                )
            )
    return out
