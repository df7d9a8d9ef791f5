"""Monthly budgets (TenantPolicy.monthly_budget, in the tenant's currency).

Spend is what the tenant's usage in the current billing period rates to
so far: tokens and GPU-seconds less the plan's discount. Fixed fees
(reservations, dedicated GPUs) and the commitment true-up are known in
advance and not counted. It is read from the hourly rollups, so it trails
the gateway by the metering pipeline's delay (a minute or two).

Crossing the soft threshold emits `budget.threshold_crossed` once per
period and budget (webhooks: the tenant's endpoints, and an email to its
owners and admins unless they opted out). Crossing the hard threshold
emits it again and makes the gateway
refuse the tenant's new requests (402, naming the budget) until the next
period begins or the budget is raised; the check runs every minute. The
gateway also holds the hard threshold request by request, exactly and
before the ledger knows (gateway/spend.py, billing.spend.terms):
this check is what emails, and what still stops usage that reaches the
ledger some other way."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.models import BudgetState
from billing.money import amount_format, from_minor, to_minor
from billing.pricing.periods import tenant_period, tenants_by_period
from billing.pricing.rating import (
    Charge,
    TenantInputs,
    charges_compute,
    rating_inputs,
    rating_session,
)
from tenants.models import Tenant, TenantPolicy
from tenants.services import policy_budget_block, policy_budget_set, policy_budget_unblock
from webhooks.choices import EventType
from webhooks.services import event_emit

logger = logging.getLogger(__name__)
SPEND_KINDS = {"tokens", "gpu_seconds", "discount"}


@dataclass(frozen=True)
class BudgetCheck:
    tenant: str
    spend: Decimal
    budget: Decimal | None
    notified_soft: bool = False
    blocked: bool = False
    unblocked: bool = False


def budget_spend(
    *, tenant: Tenant, start: datetime, end: datetime, inputs: TenantInputs | None = None
) -> Decimal:
    charges = spend_charges(tenant=tenant, start=start, end=end, inputs=inputs)
    return sum((c.amount for c in charges), Decimal(0))


def spend_charges(
    *, tenant: Tenant, start: datetime, end: datetime, inputs: TenantInputs | None = None
) -> list[Charge]:
    """The charges spend counts (SPEND_KINDS), exact: summed, the budget's
    figure; each rounded as its invoice line, what the invoice will say."""
    if inputs is None:
        inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
    charges = charges_compute(tenant=tenant, start=start, end=end, inputs=inputs)
    return [c for c in charges if c.kind in SPEND_KINDS]


def budget_used_percent(*, spend: Decimal, budget: Decimal | None) -> Decimal | None:
    """How much of the budget `spend` is, in percent to 0.1 (None: no
    budget, or a budget of 0)."""
    if not budget:
        return None
    return (spend / budget * 100).quantize(Decimal("0.1"))


def _budget_policies() -> dict[int, TenantPolicy]:
    """Tenant id -> policy, for every tenant with a budget or blocked by one."""
    return {
        p.tenant_id: p
        for p in TenantPolicy.objects.filter(
            Q(monthly_budget__isnull=False) | Q(budget_blocked_at__isnull=False)
        ).select_related("tenant")
    }


def budgets_check(*, now: datetime | None = None) -> list[BudgetCheck]:
    """Every tenant with a budget, or blocked by one; their usage is read
    in one query per billing period, not one per tenant."""
    now = now or timezone.now()
    policies = _budget_policies()
    tenants = [p.tenant for p in policies.values()]
    checks = []
    with rating_session():
        groups = tenants_by_period(tenants=tenants, moment=now, closed=False)
        for (start, end), group in groups.items():
            budgeted = [t for t in group if policies[t.pk].monthly_budget is not None]
            inputs = rating_inputs(tenants=budgeted, start=start, end=now) if budgeted else {}
            for tenant in group:
                checks.append(
                    _check(tenant, policies[tenant.pk], (start, end), now, inputs.get(tenant.pk))
                )
    return checks


def budget_set(
    *,
    tenant: Tenant,
    monthly_budget: Decimal | None,
    soft_percent: int | None = None,
    hard_percent: int | None = None,
) -> TenantPolicy:
    """A tenant's monthly budget set (None: removed) and checked at once,
    in one transaction: a tenant the minute check blocked is unblocked now
    if the new budget covers its spend, and blocked now if it no longer
    does. Its policy as it then is."""
    with transaction.atomic():  # the budget and the block it implies, or neither
        policy = policy_budget_set(
            tenant=tenant,
            monthly_budget=monthly_budget,
            soft_percent=soft_percent,
            hard_percent=hard_percent,
        )
        budget_check(tenant=tenant)
    policy.refresh_from_db()
    return policy


def budget_check(*, tenant: Tenant, now: datetime | None = None) -> BudgetCheck:
    now = now or timezone.now()
    policy = TenantPolicy.objects.get(tenant=tenant)
    return _check(tenant, policy, tenant_period(tenant=tenant, moment=now), now, None)


def _check(tenant, policy, period, now, inputs: TenantInputs | None) -> BudgetCheck:
    budget = policy.monthly_budget
    if budget is None:
        return BudgetCheck(
            tenant.slug, Decimal(0), None, unblocked=policy_budget_unblock(tenant=tenant)
        )
    start, end = period
    spend = budget_spend(tenant=tenant, start=start, end=now, inputs=inputs)
    soft = budget * policy.budget_soft_percent / 100
    hard = budget * policy.budget_hard_percent / 100
    currency = tenant.billing_currency
    with transaction.atomic():
        state, _ = BudgetState.objects.select_for_update().get_or_create(
            tenant=tenant,
            period_start=start,
            defaults={"period_end": end, "budget": budget, "spend": spend, "checked_at": now},
        )
        state.budget, state.spend, state.checked_at = budget, spend, now
        notify_soft = spend >= soft and state.soft_notified_at is None and spend < hard
        if notify_soft:
            state.soft_notified_at = now
        over = spend >= hard
        newly_over = over and state.hard_reached_at is None
        if newly_over:
            state.hard_reached_at = now
            state.soft_notified_at = state.soft_notified_at or now
        elif not over:
            state.hard_reached_at = None  # raised, or a new period: may alert again
        state.save()
        amount = amount_format(spend, currency)
        limit = f"{budget.normalize():f} {currency}"
        used = budget_used_percent(spend=spend, budget=budget)
        if over:
            message = (
                f"monthly budget of {limit} reached ({amount} spent since {start:%Y-%m-%d}): "
                f"new requests are refused until {end:%Y-%m-%d} or the budget is raised"
            )
            blocked = policy_budget_block(tenant=tenant, message=message)
            unblocked = False
        else:
            blocked, unblocked = False, policy_budget_unblock(tenant=tenant)
        data = {
            "period_start": start.isoformat(),
            "period_end": end.isoformat(),
            "currency": currency,
            "spend": str(from_minor(to_minor(spend, currency), currency)),
            "budget": str(budget),
            "used_percent": None if used is None else str(used),
        }
        if notify_soft:
            event_emit(
                type=EventType.BUDGET_THRESHOLD_CROSSED,
                tenant=tenant,
                key=f"budget.threshold_crossed:{tenant.pk}:{start.isoformat()}:soft:{budget}",
                summary=(
                    f"{tenant.name}: {used}% of the monthly budget used "
                    f"(past the {policy.budget_soft_percent}% alert threshold)"
                ),
                detail=(
                    f"Usage this period is {amount} of a {limit} monthly budget ({used}%), "
                    f"past the {policy.budget_soft_percent}% alert threshold."
                ),
                data={**data, "threshold": "soft", "percent": policy.budget_soft_percent},
            )
        if newly_over:
            event_emit(
                type=EventType.BUDGET_THRESHOLD_CROSSED,
                tenant=tenant,
                key=f"budget.threshold_crossed:{tenant.pk}:{now.isoformat()}:hard",
                summary=f"{tenant.name}: monthly budget reached",
                detail=message,
                data={**data, "threshold": "hard", "percent": policy.budget_hard_percent},
            )
    return BudgetCheck(tenant.slug, spend, budget, notify_soft, blocked, unblocked)


@dataclass(frozen=True)
class BudgetStatus:
    """Where one tenant stands against its monthly budget now (read only:
    nothing is notified or blocked by reading it)."""

    tenant: Tenant
    currency: str
    period_start: datetime
    period_end: datetime
    budget: Decimal | None
    spend: Decimal
    soft: Decimal | None
    hard: Decimal | None
    soft_percent: int
    hard_percent: int
    blocked: bool
    block_message: str
    checked_at: datetime | None  # the budget job's last check this period

    @property
    def used_percent(self) -> Decimal | None:
        return budget_used_percent(spend=self.spend, budget=self.budget)

    @property
    def level(self) -> str:
        """ok | soft (past the soft threshold) | hard (past the hard one) |
        none (no budget)."""
        if self.budget is None:
            return "none"
        if self.spend >= self.hard:
            return "hard"
        return "soft" if self.spend >= self.soft else "ok"


def budget_status_list(*, now: datetime | None = None) -> list[BudgetStatus]:
    """Every tenant with a monthly budget, or blocked by one: spend this
    billing period rated now, the same way the budget check rates it (one
    read per billing period, not per tenant), its thresholds, and whether
    the gateway refuses it."""
    now = now or timezone.now()
    policies = _budget_policies()
    checked = {}
    out = []
    with rating_session():
        groups = tenants_by_period(
            tenants=[p.tenant for p in policies.values()], moment=now, closed=False
        )
        for (start, end), group in groups.items():
            checked |= dict(
                BudgetState.objects.filter(tenant__in=group, period_start=start).values_list(
                    "tenant_id", "checked_at"
                )
            )
            budgeted = [t for t in group if policies[t.pk].monthly_budget is not None]
            inputs = rating_inputs(tenants=budgeted, start=start, end=now) if budgeted else {}
            for tenant in group:
                policy = policies[tenant.pk]
                budget = policy.monthly_budget
                spend = Decimal(0)
                if budget is not None:
                    spend = budget_spend(
                        tenant=tenant, start=start, end=now, inputs=inputs[tenant.pk]
                    )
                out.append(
                    BudgetStatus(
                        tenant=tenant,
                        currency=tenant.billing_currency,
                        period_start=start,
                        period_end=end,
                        budget=budget,
                        spend=spend,
                        soft=None if budget is None else budget * policy.budget_soft_percent / 100,
                        hard=None if budget is None else budget * policy.budget_hard_percent / 100,
                        soft_percent=policy.budget_soft_percent,
                        hard_percent=policy.budget_hard_percent,
                        blocked=policy.budget_blocked_at is not None,
                        block_message=policy.budget_block_message,
                        checked_at=checked.get(tenant.pk),
                    )
                )
    return sorted(out, key=lambda s: s.tenant.name)
