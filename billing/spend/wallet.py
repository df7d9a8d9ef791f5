"""The prepaid credit wallet. A grant's balance is its amount less what
non-void invoices spent of it (applications are ledger rows, never edited;
voiding an invoice gives its credit back by not counting it).

Order of use: the grant that expires first, then the higher priority
(lower number), then the oldest. A grant is usable on an invoice when it
is in the invoice's currency, was granted before the period ended and had
not expired when the period began."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db.models import F, Sum
from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.errors import BillingInputError
from billing.models import CreditApplication, CreditGrant
from billing.money import to_minor
from core.errors import InputError
from core.plain_decimal import plain_decimal
from tenants.models import Tenant


@dataclass(frozen=True)
class Balance:
    grant: CreditGrant
    remaining_minor: int


def wallet_balances(*, tenant: Tenant, lock: bool = False) -> list[Balance]:
    """Every grant of the tenant with what is left of it, in the order of use."""
    return wallet_balances_many(tenant_ids=[tenant.pk], lock=lock).get(tenant.pk, [])


def grant_in_force(grant: CreditGrant, now: datetime) -> bool:
    """Whether `grant` may be spent at `now`: granted by then, not expired."""
    return grant.granted_at <= now and (grant.expires_at is None or grant.expires_at > now)


def wallet_balances_many(*, tenant_ids: list[int], lock: bool = False) -> dict[int, list[Balance]]:
    """wallet_balances of many tenants in two queries (a run finalizes a
    thousand invoices at once): by tenant id, grants in the order of use,
    locked in tenant order with `lock`."""
    grants = CreditGrant.objects.filter(tenant_id__in=tenant_ids).order_by(
        "tenant_id", F("expires_at").asc(nulls_last=True), "priority", "granted_at", "pk"
    )
    if lock:
        grants = grants.select_for_update()
    grants = list(grants)
    spent = dict(
        CreditApplication.objects.filter(grant__in=grants)
        .exclude(invoice__status=InvoiceStatus.VOID)
        .values("grant_id")
        .annotate(spent=Sum("amount_minor"))
        .values_list("grant_id", "spent")
    )
    balances: dict[int, list[Balance]] = {}
    for g in grants:
        if to_minor(g.amount, g.currency) > spent.get(g.pk, 0):
            balances.setdefault(g.tenant_id, []).append(
                Balance(g, to_minor(g.amount, g.currency) - spent.get(g.pk, 0))
            )
    return balances


def credit_grant_create(
    *,
    tenant: Tenant,
    amount: Decimal,
    currency: str | None = None,
    granted_at: datetime | None = None,
    expires_at: datetime | None = None,
    priority: int = 0,
    note: str = "",
) -> CreditGrant:
    """Prepaid credit into the tenant's wallet (in its billing currency
    unless told). The gateway hears of it as the grant commits
    (gateway.terms_signals): a prepaid tenant refused for want of credit is
    served again on its next request."""
    stored = CreditGrant._meta.get_field("amount")
    try:
        amount = plain_decimal(
            amount, field="amount", places=stored.decimal_places, max_digits=stored.max_digits
        )
    except InputError as error:
        raise BillingInputError(error.field, error.message) from None
    currency = (currency or tenant.billing_currency).upper()
    if currency != tenant.billing_currency:
        # Credit pays invoices (and holds prepaid spend) in their own
        # currency only: another one would be written and never count.
        raise BillingInputError(
            "currency",
            f"credit counts only in the tenant's billing currency, "
            f"{tenant.billing_currency}, not {currency}",
        )
    if not amount.is_finite() or amount <= 0:
        raise BillingInputError("amount", f"a credit grant must be a positive amount, not {amount}")
    if to_minor(amount, currency) == 0:
        raise BillingInputError("amount", f"{amount} is less than the currency's smallest unit")
    granted_at = granted_at or timezone.now()
    if expires_at is not None and expires_at <= granted_at:
        raise BillingInputError("expires_at", "a grant must expire after it is granted")
    return CreditGrant.objects.create(
        tenant=tenant,
        amount=amount,
        currency=currency,
        granted_at=granted_at,
        expires_at=expires_at,
        priority=priority,
        note=note,
    )
