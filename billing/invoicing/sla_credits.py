"""SLA credits on an invoice: a billing period that missed its policy's
targets (billing.sla.compliance) gets a credit line per missed metric,
naming the measured figure and the target, for a percent of the period's
usage charges: token and GPU-second charges net of the plan's discount
(reservation and dedicated fees and the commitment true-up are not
usage). Each line is rounded once, like every line (billing.money).

Finance's newest decision on a credit (billing.invoicing.sla_adjustments)
is applied as recorded: waived, no line; adjusted, its percent instead.
Compliance is measured when the invoice is rated: a draft rebuilt is
measured again (its lines are replaced, never added to, so a re-run has
each credit once); a finalized invoice keeps what it said. SLA credits
are not usage: late usage for a period never revisits them."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from billing.choices import LineKind, SlaAdjustmentAction
from billing.invoicing.lines import LineDraft
from billing.models import SlaCreditAdjustment, Subscription
from billing.money import money_format, to_minor
from billing.pricing.rating import Charge
from billing.sla.compliance import HUNDRED, Compliance, compliance_by_tenant, sla_credits
from billing.sla.policies import slo_policies_load
from tenants.models import Tenant

USAGE_KINDS = frozenset({LineKind.TOKENS, LineKind.GPU_SECONDS, LineKind.DISCOUNT})


@dataclass(frozen=True)
class SlaReads:
    """What the SLA credits of one period read, for many tenants at once:
    each tenant's compliance over the period (tenants whose policy has a
    credit schedule) and finance's newest decision per (tenant, metric)."""

    compliance: dict[int, Compliance] = field(default_factory=dict)
    adjustments: dict[tuple[int, str], SlaCreditAdjustment] = field(default_factory=dict)


def sla_reads(
    *,
    tenants: list[Tenant],
    start: datetime,
    end: datetime,
    subscriptions: dict[int, Subscription | None],
) -> SlaReads:
    """One ledger query for all `tenants` (none when no policy has a
    schedule), one for the decisions."""
    policies = slo_policies_load()
    if not policies:
        return SlaReads()
    scheduled = {}
    for tenant in tenants:
        policy = policies.for_tenant(tenant, subscriptions.get(tenant.pk))
        if policy is not None and policy.credit_rules.all():
            scheduled[tenant.pk] = policy
    if not scheduled:
        return SlaReads()
    compliance = compliance_by_tenant(policies=scheduled, start=start, end=end, by_day=False)
    return SlaReads(
        compliance={tenant_id: rows[0] for tenant_id, rows in compliance.items()},
        adjustments=sla_adjustments_newest(tenant_ids=list(compliance), period_start=start),
    )


def sla_adjustments_newest(
    *, tenant_ids: list[int], period_start: datetime
) -> dict[tuple[int, str], SlaCreditAdjustment]:
    """Finance's newest decision per (tenant, metric) for the period."""
    out: dict[tuple[int, str], SlaCreditAdjustment] = {}
    rows = SlaCreditAdjustment.objects.filter(
        tenant_id__in=tenant_ids, period_start=period_start
    ).order_by("created_at", "pk")
    for row in rows:
        out[(row.tenant_id, row.metric)] = row
    return out


def sla_decisions(*, tenant_id: int, period_start: datetime) -> list[SlaCreditAdjustment]:
    """Finance's decisions on a tenant's period's SLA credits, newest
    first, with who made them (finance staff code paths only)."""
    return list(
        SlaCreditAdjustment.objects.filter(tenant_id=tenant_id, period_start=period_start)
        .select_related("tenant", "created_by")
        .order_by("-created_at", "-pk")
    )


def usage_charges(charges: Iterable[Charge]) -> Decimal:
    """What the period's usage came to: token and GPU-second charges less
    the plan's discount, exact."""
    return sum((c.amount for c in charges if c.kind in USAGE_KINDS), Decimal(0))


def sla_credit_lines(
    *,
    tenant: Tenant,
    charges: list[Charge],
    currency: str,
    start: datetime,
    end: datetime,
    reads: SlaReads,
) -> list[LineDraft]:
    """The period's SLA credit lines (none without a missed target or
    without usage charges)."""
    compliance = reads.compliance.get(tenant.pk)
    base = usage_charges(charges)
    if compliance is None or base <= 0:
        return []
    lines = []
    for credit in sla_credits(compliance):
        percent, note = credit.percent, ""
        decision = reads.adjustments.get((tenant.pk, credit.metric))
        if decision is not None:
            if decision.action == SlaAdjustmentAction.WAIVE:
                continue
            percent, note = decision.credit_percent, f", adjusted from {_pct(credit.percent)}%"
            if not percent:
                continue
        exact = base * percent / HUNDRED
        minor = to_minor(exact, currency)
        lines.append(
            LineDraft(
                kind=LineKind.SLA_CREDIT,
                description=(
                    f"SLA credit: {credit.text}: {_pct(percent)}% of usage charges "
                    f"({money_format(to_minor(base, currency), currency)}{note})"
                ),
                quantity=Decimal(1),
                unit_price=None,
                amount=-exact,
                amount_minor=-minor,
                service_start=start,
                service_end=end,
                sla_metric=credit.metric,
            )
        )
    return lines


def _pct(percent: Decimal) -> str:
    """10.00 -> '10', 2.50 -> '2.5'."""
    return format(percent.normalize(), "f")
