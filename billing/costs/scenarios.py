"""What-if scenarios: a past period re-allocated under other rates or
another idle policy, stored apart from the booked results and compared
with them side by side."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Sum

from billing.costs.rates import cost_rate_create
from billing.costs.runs import allocation_run_create
from billing.models import AllocationRun, CostAllocation, CostScenario, PoolHourCost

UNALLOCATED = "(unallocated)"
COMPARE_BY = {"tenant": "tenant__slug", "tier": "pool_kind", "pool": "pool__name"}


def cost_scenario_create(
    *,
    name: str,
    start: datetime,
    end: datetime,
    idle_cost_policy: str = "",
    rates: Sequence[dict] = (),
    description: str = "",
    user=None,
) -> tuple[CostScenario, AllocationRun]:
    """The scenario, its own rates and its queued run, all or nothing."""
    with transaction.atomic():
        if CostScenario.objects.filter(name=name).exists():
            raise ValidationError({"name": "a scenario with this name exists"})
        scenario = CostScenario.objects.create(
            name=name,
            start=start,
            end=end,
            idle_cost_policy=idle_cost_policy,
            description=description,
            created_by=user,
        )
        for index, rate in enumerate(rates):
            try:
                cost_rate_create(**rate, scenario=scenario, user=user)
            except ValidationError as exc:
                raise ValidationError(
                    {f"rates.{index}.{k}": v for k, v in exc.message_dict.items()}
                ) from exc
        run = allocation_run_create(start=start, end=end, scenario=scenario, user=user)
    return scenario, run


def scenario_compare(*, scenario: CostScenario, by: str) -> list[dict]:
    """Booked against scenario cost over the scenario's period, per tenant,
    tier or pool: total each way and the difference."""
    key = COMPARE_BY[by]
    period = {"hour__gte": scenario.start, "hour__lt": scenario.end}

    def totals(book: CostScenario | None) -> dict:
        rows = (
            CostAllocation.objects.filter(scenario=book, **period)
            .values(key)
            .annotate(total=Sum("total"), idle=Sum("idle"))
        )
        return {row[key]: row for row in rows}

    booked, what_if = totals(None), totals(scenario)
    zero = Decimal(0)
    out = []
    for name in sorted(set(booked) | set(what_if)):
        b = booked.get(name, {}).get("total") or zero
        s = what_if.get(name, {}).get("total") or zero
        out.append({by: name, "booked": b, "scenario": s, "difference": s - b})

    def unallocated(book: CostScenario | None) -> Decimal:
        rows = PoolHourCost.objects.filter(scenario=book, **period)
        return rows.aggregate(total=Sum("unallocated"))["total"] or zero

    b, s = unallocated(None), unallocated(scenario)
    out.append({by: UNALLOCATED, "booked": b, "scenario": s, "difference": s - b})
    return out
