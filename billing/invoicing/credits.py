"""Applying the prepaid wallet to an invoice as it is finalized (the
wallet itself, its grants and balances, is spend control's:
billing.spend.wallet)."""

from __future__ import annotations

from billing.models import Invoice
from billing.spend.wallet import Balance


def credits_plan(*, invoice: Invoice, balances: list[Balance], due_minor: int):
    """(grant, minor units) to apply to `invoice`, at most what it owes."""
    plan = []
    for balance in balances:
        if due_minor <= 0:
            break
        grant = balance.grant
        usable = (
            grant.currency == invoice.currency
            and grant.granted_at < invoice.period_end
            and (grant.expires_at is None or grant.expires_at > invoice.period_start)
        )
        if usable:
            take = min(balance.remaining_minor, due_minor)
            plan.append((grant, take))
            due_minor -= take
    return plan
