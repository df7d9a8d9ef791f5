"""Reads of allocation results for finance staff: cost by period and any of
tier, pool, tenant and model; cost per million tokens; utilization per
pool-hour; the allocation runs and the booked cost rates. Booked results
unless a scenario is named."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import F, QuerySet, Sum
from django.db.models.functions import TruncDay, TruncMonth

from billing.choices import ReportKind, RunStatus
from billing.errors import CostCurrencyError
from billing.models import (
    AllocationRun,
    CostAllocation,
    CostRate,
    CostScenario,
    MarginReport,
    PoolHourCost,
)
from metering.selectors.totals import usage_tokens_by_model_pool

COST_COLUMNS = ("capital", "energy", "other_opex", "idle", "total")
GROUP_KEYS = {
    "tier": F("pool_kind"),
    "pool": F("pool__name"),
    "tenant": F("tenant__slug"),
    "model": F("served_model__name"),
    "hour": F("hour"),
    "day": TruncDay("hour"),
    "month": TruncMonth("hour"),
}
PER_MILLION = Decimal(1_000_000)
NINE_PLACES = Decimal("0.000000001")


def cost_allocation_summary(
    *, start: datetime, end: datetime, group_by: list[str], scenario: CostScenario | None = None
) -> list[dict]:
    """Allocated cost by component and device-seconds, per group."""
    rows = (
        CostAllocation.objects.filter(scenario=scenario, hour__gte=start, hour__lt=end)
        .annotate(**{f"g_{key}": GROUP_KEYS[key] for key in group_by})
        .values(*(f"g_{key}" for key in group_by))
        .annotate(
            device_seconds=Sum("device_seconds"),
            **{column: Sum(column) for column in COST_COLUMNS},
        )
        .order_by(*(f"g_{key}" for key in group_by))
    )
    return [{**{key: row.pop(f"g_{key}") for key in group_by}, **row} for row in rows]


def unallocated_summary(
    *, start: datetime, end: datetime, group_by: str, scenario: CostScenario | None = None
) -> list[dict]:
    """Cost no tenant carries (platform idle, spare GPUs), per tier or pool,
    and per currency the cost is booked in (never summed across two)."""
    key = {"tier": F("pool_kind"), "pool": F("pool__name")}[group_by]
    rows = (
        PoolHourCost.objects.filter(scenario=scenario, hour__gte=start, hour__lt=end)
        .annotate(g=key)
        .values("g", "currency")
        .annotate(unallocated=Sum("unallocated"), total=Sum("total"))
        .order_by("g", "currency")
    )
    return [
        {group_by: row["g"] or "", **{k: row[k] for k in ("currency", "unallocated", "total")}}
        for row in rows
    ]


def cost_per_million_tokens(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None
) -> list[dict]:
    """Per model and pool: the cost allocated to its use (idle share
    included) over the tokens it processed, input and output together."""
    period = {"hour__gte": start, "hour__lt": end}
    cost = {
        (r["served_model__name"], r["pool__name"]): r["total"]
        for r in CostAllocation.objects.filter(
            scenario=scenario, served_model__isnull=False, **period
        )
        .values("served_model__name", "pool__name")
        .annotate(total=Sum("total"))
    }
    tokens = {
        (r["served_model__name"], r["pool__name"]): r
        for r in usage_tokens_by_model_pool(start=start, end=end)
    }
    out = []
    for model, pool in sorted(set(cost) | set(tokens)):
        used = tokens.get((model, pool), {})
        n = (used.get("prompt") or 0) + (used.get("completion") or 0)
        total = cost.get((model, pool), Decimal(0))
        out.append(
            {
                "model": model,
                "pool": pool,
                "cost": total,
                "prompt_tokens": used.get("prompt") or 0,
                "completion_tokens": used.get("completion") or 0,
                "cost_per_million_tokens": (total * PER_MILLION / n).quantize(NINE_PLACES)
                if n
                else None,
            }
        )
    return out


def pool_utilization(
    *,
    start: datetime,
    end: datetime,
    pool_id: int | None = None,
    scenario: CostScenario | None = None,
) -> QuerySet:
    """Per pool and hour: GPUs, busy and available device-seconds, cost."""
    rows = PoolHourCost.objects.filter(
        scenario=scenario, hour__gte=start, hour__lt=end, pool__isnull=False
    )
    if pool_id is not None:
        rows = rows.filter(pool_id=pool_id)
    return rows.select_related("pool").order_by("hour", "pool__name")


def pool_utilization_summary(
    *, start: datetime, end: datetime, scenario: CostScenario | None = None
) -> list[dict]:
    """Per pool over a period: busy / available device-seconds, and cost
    in `costs`, one entry per currency it is booked in (one, unless the
    reporting currency changed within the period: never summed across two)."""
    rows = (
        PoolHourCost.objects.filter(
            scenario=scenario, hour__gte=start, hour__lt=end, pool__isnull=False
        )
        .values("pool__name", "pool_kind", "currency")
        .annotate(
            busy=Sum("busy_seconds"),
            capacity=Sum("capacity_seconds"),
            total=Sum("total"),
            unallocated=Sum("unallocated"),
        )
        .order_by("pool__name", "currency")
    )
    pools: dict[str, dict] = {}
    for r in rows:
        pool = pools.setdefault(
            r["pool__name"],
            {
                "pool": r["pool__name"],
                "tier": r["pool_kind"],
                "busy": 0,
                "capacity": 0,
                "costs": [],
            },
        )
        pool["busy"] += r["busy"]
        pool["capacity"] += r["capacity"]
        pool["costs"].append(
            {"currency": r["currency"], "total": r["total"], "unallocated": r["unallocated"]}
        )
    out = []
    for pool in pools.values():
        ratio = pool["busy"] / pool["capacity"] if pool["capacity"] else 0
        out.append(
            {
                "pool": pool["pool"],
                "tier": pool["tier"],
                "utilization": float(ratio),  # ok-float: a ratio, not money
                "costs": pool["costs"],
            }
        )
    return out


def pool_utilization_series(
    *, start: datetime, end: datetime, bucket: str = "day", scenario: CostScenario | None = None
) -> dict:
    """Busy over available device-seconds per pool per hour or day, as a
    chart's labels and one series per pool (percent, None where a pool had
    no capacity in a bucket)."""
    trunc = {"hour": F("hour"), "day": TruncDay("hour")}[bucket]
    rows = (
        PoolHourCost.objects.filter(
            scenario=scenario, hour__gte=start, hour__lt=end, pool__isnull=False
        )
        .annotate(bucket=trunc)
        .values("bucket", "pool__name")
        .annotate(busy=Sum("busy_seconds"), capacity=Sum("capacity_seconds"))
        .order_by("bucket", "pool__name")
    )
    buckets: list[datetime] = []
    pct: dict[str, dict[datetime, float]] = {}  # ok-float: utilization percentages, charted
    for row in rows:
        if not buckets or buckets[-1] != row["bucket"]:
            buckets.append(row["bucket"])
        if row["capacity"]:
            ratio = round(float(row["busy"] / row["capacity"] * 100), 2)  # ok-float: a chart's y
            pct.setdefault(row["pool__name"], {})[row["bucket"]] = ratio
    fmt = "%Y-%m-%d %H:00" if bucket == "hour" else "%Y-%m-%d"
    return {
        "labels": [b.strftime(fmt) for b in buckets],
        "datasets": [
            {"label": pool, "data": [values.get(b) for b in buckets]}
            for pool, values in sorted(pct.items())
        ],
    }


def margin_report_latest(*, moment: datetime | None = None) -> MarginReport | None:
    """The stored report to show: the month-to-date one if computed, else
    the newest; with `moment`, the newest covering it, if any. Without
    its CSV and HTML (pages read its tables)."""
    done = MarginReport.objects.filter(status=RunStatus.DONE).defer("csv", "html")
    if moment is not None:
        covering = done.filter(period_start__lte=moment, period_end__gt=moment)
        return covering.order_by("-finished_at").first()
    return (
        done.filter(kind=ReportKind.MONTH_TO_DATE).order_by("-period_end").first()
        or done.order_by("-period_end", "-finished_at").first()
    )


def margin_report_failed_after(*, report: MarginReport | None) -> MarginReport | None:
    """The newest report that failed after `report` was built (or at all,
    when there is none): the pages say why it is not the one shown."""
    failed = MarginReport.objects.filter(status=RunStatus.FAILED).defer("csv", "html", "tables")
    if report is not None and report.finished_at is not None:
        failed = failed.filter(finished_at__gt=report.finished_at)
    return failed.order_by("-finished_at").first()


def cost_currency_check(*, start, end, currency) -> None:
    """Booked cost is in the currency it was booked in (the reporting
    currency then, costs entered in others converted: billing.costs.period);
    a report in another currency refuses it, naming the hour to re-run."""
    other = (
        PoolHourCost.objects.filter(scenario__isnull=True, hour__gte=start, hour__lt=end)
        .exclude(currency=currency)
        .order_by("hour")
        .values_list("hour", "currency")
        .first()
    )
    if other is not None:
        hour, booked = other
        raise CostCurrencyError(
            f"cost from {hour:%Y-%m-%d %H:00} UTC is booked in {booked} but the reporting "
            f"currency is {currency}: run the allocation of that period again"
        )


def allocation_run_list() -> QuerySet[AllocationRun]:
    """Allocation runs, the newest first, with their scenario."""
    return AllocationRun.objects.select_related("scenario").order_by("-created_at")


def cost_rate_booked_list() -> QuerySet[CostRate]:
    """The booked cost rates (no scenario's), history included, with their
    pool: by component, pool and hour band, the newest first in each."""
    return (
        CostRate.objects.filter(scenario__isnull=True)
        .select_related("pool")
        .order_by("component", "pool__name", "hour_from", "-effective_from")
    )
