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
from itertools import pairwise

from billing.choices import LineKind, SlaAdjustmentAction
from billing.invoicing.lines import LineDraft
from billing.models import SlaCreditAdjustment
from billing.money import money_format, to_minor
from billing.pricing.rating import Charge, TenantInputs
from billing.sla.compliance import HUNDRED, Compliance, compliance_by_tenant, sla_credits
from billing.sla.policies import slo_policies_load
from tenants.models import Tenant
from tenants.selectors import tier_at

USAGE_KINDS = frozenset({LineKind.TOKENS, LineKind.GPU_SECONDS, LineKind.DISCOUNT})


@dataclass(frozen=True)
class SlaReads:
    """What the SLA credits of one period read, for many tenants at once:
    each tenant's compliance over the period (tenants whose policy has a
    credit schedule) and finance's newest decision per (tenant, metric)."""

    compliance: dict[int, Compliance] = field(default_factory=dict)
    adjustments: dict[tuple[int, str], SlaCreditAdjustment] = field(default_factory=dict)
    # A tenant whose tier or plan (so its policy) changed inside the period:
    # each stretch judged under the policy in force then, (from, to, compliance).
    stretches: dict[int, list[tuple[datetime, datetime, Compliance]]] = field(default_factory=dict)


def sla_reads(
    *,
    tenants: list[Tenant],
    start: datetime,
    end: datetime,
    inputs: dict[int, TenantInputs],
) -> SlaReads:
    """One ledger query for all `tenants` (none when no policy has a
    schedule), one for the decisions. `inputs`: rating's, for the period
    (each tenant's subscription at its start, tier and plan moves in it)."""
    policies = slo_policies_load()
    if not policies:
        return SlaReads()
    changing = policy_stretches(
        tenants=tenants, start=start, end=end, policies=policies, inputs=inputs
    )
    scheduled = {}
    for tenant in tenants:
        if tenant.pk in changing:
            continue
        policy = policies.for_tenant(tenant, inputs[tenant.pk].subscription)
        if policy is not None and policy.credit_rules.all():
            scheduled[tenant.pk] = policy
    compliance = (
        compliance_by_tenant(policies=scheduled, start=start, end=end, by_day=False)
        if scheduled
        else {}
    )
    stretches: dict[int, list[tuple[datetime, datetime, Compliance]]] = {}
    for tenant_id, spans in changing.items():
        for since, until, policy in spans:  # a few tenants a period: a query a stretch
            if policy is None or not policy.credit_rules.all():
                continue
            found = compliance_by_tenant(
                policies={tenant_id: policy}, start=since, end=until, by_day=False
            )
            if tenant_id in found:
                stretches.setdefault(tenant_id, []).append((since, until, found[tenant_id][0]))
    judged = list(compliance) + list(stretches)
    if not judged:
        return SlaReads()
    return SlaReads(
        compliance={tenant_id: rows[0] for tenant_id, rows in compliance.items()},
        adjustments=sla_adjustments_newest(tenant_ids=judged, period_start=start),
        stretches=stretches,
    )


def policy_stretches(
    *, tenants: list[Tenant], start: datetime, end: datetime, policies, inputs: dict
) -> dict[int, list[tuple[datetime, datetime, object]]]:
    """The tenants whose SLO policy changed inside [start, end) (a tier
    move, a plan move, as rating's `inputs` hold them): each stretch of one
    policy as (from, to, policy)."""
    out = {}
    for tenant in tenants:
        read = inputs[tenant.pk]
        tiers = read.tiers or ((None, tenant.tier),)
        moments = {since for since, _ in tiers if since and start < since < end}
        moments |= {since for since, _ in read.plans if start < since < end}
        if not moments:
            continue
        bounds = [start, *sorted(moments), end]
        spans: list[list] = []
        for since, until in pairwise(bounds):
            subscription = (
                next((sub for at, sub in reversed(read.plans) if at <= since), None)
                if read.plans
                else read.subscription
            )
            policy = policies.for_tier(tier_at(tiers, since), subscription)
            if spans and spans[-1][2] == policy:
                spans[-1][1] = until  # the same policy on both sides: one stretch
            else:
                spans.append([since, until, policy])
        if len(spans) > 1:
            out[tenant.pk] = [tuple(span) for span in spans]
    return out


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
    used_from: dict[datetime, Decimal] | None = None,
) -> list[LineDraft]:
    """The period's SLA credit lines (none without a missed target or
    without usage charges). `used_from`: the usage amount by stretch
    (rating's), for a tenant whose policy changed inside the period."""
    base = usage_charges(charges)
    if base <= 0:
        return []
    if tenant.pk in reads.stretches:
        return _stretch_credit_lines(
            tenant=tenant, charges=charges, currency=currency, start=start, end=end, reads=reads,
            used_from=used_from or {},
        )  # fmt: skip
    compliance = reads.compliance.get(tenant.pk)
    if compliance is None:
        return []
    return _credit_lines(
        tenant=tenant, compliance=compliance, base=base, currency=currency, start=start, end=end,
        reads=reads,
    )  # fmt: skip


def _stretch_credit_lines(
    *, tenant, charges, currency, start, end, reads: SlaReads, used_from
) -> list[LineDraft]:
    """Each stretch's credits, on that stretch's usage charges (its share
    of the period's, net of the discount as the period's are)."""
    gross = sum(used_from.values(), Decimal(0))
    net = usage_charges(charges)
    lines = []
    for since, until, compliance in reads.stretches[tenant.pk]:
        used = sum((a for t, a in used_from.items() if since <= t < until), Decimal(0))
        base = used * net / gross if gross else Decimal(0)
        if base <= 0:
            continue
        when = f" ({since:%Y-%m-%d %H:%M} to {until:%Y-%m-%d %H:%M} UTC)"
        lines += _credit_lines(
            tenant=tenant, compliance=compliance, base=base, currency=currency, start=start,
            end=end, reads=reads, when=when,
        )  # fmt: skip
    return lines


def _credit_lines(
    *, tenant, compliance: Compliance, base: Decimal, currency, start, end, reads, when=""
) -> list[LineDraft]:
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
                    f"({money_format(to_minor(base, currency), currency)}{note}){when}"
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
