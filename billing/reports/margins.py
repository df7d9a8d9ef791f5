"""Margin: revenue less the cost of the GPUs that earned it, from the same
period's booked data. Computed with pandas over rows aggregated in SQL
(never raw events), in integer nano-units so that, at every level,
margin = revenue - cost exactly.

Cost is what allocation booked: each tenant's allocated cost (capital,
energy, other opex, its share of idle) plus each pool's unabsorbed idle
cost (idle no tenant carries), shown on its own "(unabsorbed)" row; spare
GPUs that no replica holds are the "(spare)" tier.

Revenue is net of SLA credits (revenue given back for missed service
levels, billing.reports.revenue); `sla_credit` shows them, the revenue
lost, at every level.

Levels: tier, the kind of pool it ran in (shared, reserved, dedicated:
where it ran), tenant_tier, the tier the tenant bought (what was sold: a
reserved-tier tenant with no reservation runs in the shared pool), pool,
tenant, model, and model by pool and by tenant (a model's drill-down;
what names no model is two rows there, FEES and IDLE);
unabsorbed idle and spare GPUs are rows of their own in both tier views, so
each sums to the total; each row
with margin %, tokens, cost per million tokens and, where capacity is
known (tier and pool), GPU-hours, utilization and revenue per GPU-hour.
`previous` adds the same figures for the period before (month over month).

Currency: every amount is in the reporting currency (billing.fx). Revenue
billed in another currency (the tenant's billing currency, the currency of
its invoices) is converted at the period's average rate, once per (tenant,
pool, model) row, rounded half-even to a nano-unit; levels sum converted
rows, so margin = revenue - cost stays exact. The amounts as billed are
kept beside it, one `revenue_in_<CUR>` column per billing currency. Cost
is booked in the reporting currency (a cost rate or GPU price entered in
another currency converted at the rate of each hour's day when it is
allocated: billing.costs.period); cost booked in another reporting
currency fails the report (CostCurrencyError) rather than being added to
it as if it were the same money."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

import numpy as np
import pandas as pd
from django.db.models import Sum

from billing.costs.selectors import cost_allocation_summary, cost_currency_check
from billing.fx import FxConversion, fx_convert_nano, fx_period_rate, reporting_currency
from billing.models import PoolHourCost
from billing.reports.revenue import revenue_rows
from core.nanos import NANO
from metering.selectors.totals import usage_tokens_by_tenant_pool_model
from serving.models import Pool, ServedModel
from tenants.models import Tenant
from tenants.selectors import tier_at, tier_timelines

KEYS = ["tier", "pool", "tenant", "model"]
DETAIL_KEYS = [*KEYS, "tenant_tier"]
MONEY = ["revenue", "capital", "energy", "other_opex", "idle", "unabsorbed"]
LEVELS = {
    "tier": ["tier"],  # the pool's kind: where it ran
    "tenant_tier": ["tenant_tier"],  # the tenant's tier: what was sold
    "pool": ["tier", "pool"],
    "tenant": ["tenant"],
    "model": ["model"],
    "model_pool": ["model", "pool"],  # a model's drill-down: where it ran
    "model_tenant": ["model", "tenant"],  # and who used it
}
UNABSORBED, SPARE = "(unabsorbed)", "(spare)"
# By model, what no model earned or cost is two rows, not one: fees
# (reservation, dedicated and commitment fees, discounts and credits with
# no usage to follow) and idle capacity (reserved and dedicated GPUs'
# idle hours their holder carries, and unabsorbed idle cost).
FEES, IDLE = "(fees, no model)", "(idle capacity, no model)"
# Margin % is not meaningful ("n/m") where revenue is not positive or is
# below 1% of cost (a margin under -9,900%): a few cents of revenue against
# a day of idle GPUs reads -423,553%, which says nothing the amounts do
# not. A share of cost rather than a fixed amount, so that it holds in
# every reporting currency (one yen and one dollar are not the same floor).
MARGIN_PCT_FLOOR = 0.01

ORIGINAL = "revenue_in_"  # + ISO code: revenue as billed, in that currency
LOST = "sla_credit"  # revenue given back for missed service levels (not a cost)


@dataclass
class MarginData:
    # DETAIL_KEYS + MONEY + LOST (int nano) + tokens, device_seconds, ORIGINAL*
    detail: pd.DataFrame
    capacity: pd.DataFrame  # tier, pool, capacity_seconds, busy_seconds
    currency: str = "USD"  # of every MONEY column
    conversions: list[FxConversion] = field(default_factory=list)


def original_columns(frame: pd.DataFrame) -> list[str]:
    """The revenue-as-billed columns, one per billing currency, sorted."""
    return sorted(c for c in frame.columns if c.startswith(ORIGINAL))


def margin_data(*, start: datetime, end: datetime, currency: str | None = None) -> MarginData:
    """The period's figures in `currency` (default: the reporting currency).
    Raises FxRateMissingError or CostCurrencyError (billing.errors)."""
    currency = currency or reporting_currency()
    cost_currency_check(start=start, end=end, currency=currency)
    pools = {p.pk: (p.name, p.kind) for p in Pool.objects.all()}
    tenants = {t.pk: (t.slug, t.tier, t.billing_currency) for t in Tenant.objects.all()}
    revenue, conversions = _revenue(
        start=start, end=end, pools=pools, tenants=tenants, currency=currency
    )
    parts = [
        revenue,
        _costs(start=start, end=end),
        _unabsorbed(start=start, end=end, pools=pools),
        _tokens(start=start, end=end, pools=pools, tenants=tenants),
    ]
    parts = [p for p in parts if len(p)]
    empty = pd.DataFrame(columns=[*KEYS, *MONEY, LOST, "tokens", "device_seconds"])
    detail = pd.concat(parts, ignore_index=True) if parts else empty
    for column in [*MONEY, LOST, "tokens"]:
        detail[column] = detail.get(column, 0)
    detail["device_seconds"] = detail.get("device_seconds", 0.0)
    detail[KEYS] = detail[KEYS].fillna("")
    # What was sold: the tier of the tenant, whatever pool served it, as it
    # was at the period's end (a tenant moved since is filed as it was, so a
    # re-run files it the same); cost no tenant carries (unabsorbed idle,
    # spare GPUs) is a row of its own.
    moved = tier_timelines(list(tenants))
    last_hour = end - timedelta(microseconds=1)
    tier_of = {
        slug: tier_at(moved[pk], last_hour) if pk in moved else tier
        for pk, (slug, tier, _) in tenants.items()
    }
    detail["tenant_tier"] = [tier_of.get(slug, UNABSORBED) for slug in detail["tenant"]]
    integers = [*MONEY, LOST, "tokens", *original_columns(detail)]
    detail[integers] = detail[integers].fillna(0).astype(np.int64)
    detail["device_seconds"] = detail["device_seconds"].fillna(0.0).astype(np.float64)
    detail = detail.groupby(DETAIL_KEYS, as_index=False).sum()
    return MarginData(
        detail=detail,
        capacity=_capacity(start=start, end=end, pools=pools),
        currency=currency,
        conversions=conversions,
    )


def margin_table(data: MarginData, level: str, previous: MarginData | None = None) -> pd.DataFrame:
    keys = LEVELS[level]
    originals = original_columns(data.detail)
    sums = [*MONEY, LOST, "tokens", "device_seconds", *originals]
    detail = _no_model_split(data.detail) if "model" in keys else data.detail
    table = detail.groupby(keys, as_index=False)[sums].sum()
    table["cost"] = table[MONEY[1:]].sum(axis=1)
    table["margin"] = table["revenue"] - table["cost"]
    revenue, cost = table["revenue"].astype(np.float64), table["cost"].astype(np.float64)
    meaningful = (revenue > 0) & (revenue >= cost * MARGIN_PCT_FLOOR)
    with np.errstate(divide="ignore", invalid="ignore"):
        table["margin_pct"] = np.where(meaningful, table["margin"] / table["revenue"] * 100, np.nan)
        table["cost_per_mtok"] = np.where(
            table["tokens"] > 0, table["cost"] / table["tokens"] * 1e6 / NANO, np.nan
        )
    # A row with revenue or cost whose margin % is not meaningful: "n/m".
    table["margin_pct_nm"] = ~meaningful & ((table["revenue"] != 0) | (table["cost"] != 0))
    if set(keys) <= {"tier", "pool"}:
        capacity = data.capacity.groupby(keys, as_index=False)[
            ["capacity_seconds", "busy_seconds"]
        ].sum()
        table = table.merge(capacity, on=keys, how="left")
        for column in ("capacity_seconds", "busy_seconds"):  # float even when none matched
            table[column] = table[column].astype(np.float64)
        table["gpu_hours"] = table["capacity_seconds"].fillna(0) / 3600
        with np.errstate(divide="ignore", invalid="ignore"):
            table["utilization_pct"] = np.where(
                table["capacity_seconds"] > 0,
                table["busy_seconds"] / table["capacity_seconds"] * 100,
                np.nan,
            )
            table["revenue_per_gpu_hour"] = np.where(
                table["gpu_hours"] > 0, table["revenue"] / NANO / table["gpu_hours"], np.nan
            )
        table = table.drop(columns=["capacity_seconds", "busy_seconds"])
    if previous is not None:
        before = margin_table(previous, level)[[*keys, "revenue", "cost", "margin"]]
        before = before.rename(columns={c: f"prev_{c}" for c in ("revenue", "cost", "margin")})
        table = table.merge(before, on=keys, how="outer")
        # A row only last month had (a tenant gone, idle then but not now) is zero now.
        for column in (
            *MONEY,
            LOST,
            "cost",
            "margin",
            "tokens",
            *originals,
            *before.columns.drop(keys),
        ):
            table[column] = table[column].fillna(0).astype(np.int64)
        table["device_seconds"] = table["device_seconds"].fillna(0.0)
        table["margin_pct_nm"] = table["margin_pct_nm"].astype("boolean").fillna(False)
        table["margin_pct_nm"] = table["margin_pct_nm"].astype(bool)
        with np.errstate(divide="ignore", invalid="ignore"):
            table["revenue_change_pct"] = np.where(
                table["prev_revenue"] != 0,
                (table["revenue"] - table["prev_revenue"]) / table["prev_revenue"].abs() * 100,
                np.nan,
            )
    return table.sort_values(keys).reset_index(drop=True)


def _no_model_split(detail: pd.DataFrame) -> pd.DataFrame:
    """The detail with each row naming no model split in two: its revenue
    (and SLA credits, and revenue as billed) under FEES, its cost, tokens
    and device-seconds under IDLE; rows left with nothing are dropped."""
    none = detail["model"] == ""
    if not none.any():
        return detail
    rows = detail[none]
    earned = ["revenue", LOST, *original_columns(detail)]
    costs = [c for c in detail.columns if c in (*MONEY[1:], "tokens", "device_seconds")]
    fees = rows.assign(model=FEES, **{c: 0 for c in costs})
    idle = rows.assign(model=IDLE, **{c: 0 for c in earned})
    fees = fees[(fees[earned] != 0).any(axis=1)]
    idle = idle[(idle[costs] != 0).any(axis=1)]
    return pd.concat([detail[~none], fees, idle], ignore_index=True)


def margin_totals(data: MarginData) -> dict[str, int]:
    sums = data.detail[MONEY].sum()
    cost = int(sums[MONEY[1:]].sum())
    return {"revenue": int(sums["revenue"]), "cost": cost, "margin": int(sums["revenue"]) - cost}


def margin_revenue_by_currency(data: MarginData) -> dict[str, int]:
    """Revenue as billed, per billing currency (nano-units of each)."""
    return {
        column.removeprefix(ORIGINAL): int(data.detail[column].sum())
        for column in original_columns(data.detail)
    }


# --- the inputs, aggregated in SQL -----------------------------------------


def _revenue(*, start, end, pools, tenants, currency) -> tuple[pd.DataFrame, list]:
    rows = revenue_rows(start=start, end=end)
    if rows.empty:
        return rows, []
    billed_in = rows["tenant_id"].map(lambda t: tenants[t][2])
    rates, conversions = {}, []
    for code in sorted(set(billed_in)):
        if code == currency or not rows.loc[billed_in == code, ["revenue", LOST]].any().any():
            rates[code] = None  # nothing to convert
            continue
        conversion = fx_period_rate(base=code, quote=currency, start=start, end=end)
        rates[code] = conversion.rate
        conversions.append(conversion)

    def convert(column: str) -> np.ndarray:
        converted = [
            int(nano) if rates[code] is None else fx_convert_nano(int(nano), rates[code])
            for nano, code in zip(rows[column], billed_in, strict=True)
        ]
        return np.array(converted, dtype=np.int64)

    out = pd.DataFrame(
        {
            "tenant": rows["tenant_id"].map(lambda t: tenants[t][0]),
            "pool": rows["pool_id"].map(lambda p: pools[p][0] if pd.notna(p) else ""),
            "tier": [
                pools[p][1] if pd.notna(p) else tenants[t][1]
                for p, t in zip(rows["pool_id"], rows["tenant_id"], strict=True)
            ],
            "model": rows["model"].astype(object).fillna(""),
            "revenue": convert("revenue"),
            LOST: convert(LOST),
        }
    )
    for code in sorted(set(billed_in)):
        out[f"{ORIGINAL}{code}"] = np.where(billed_in == code, rows["revenue"], 0).astype(np.int64)
    return out, conversions


def _costs(*, start, end) -> pd.DataFrame:
    rows = cost_allocation_summary(start=start, end=end, group_by=KEYS)
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    for column in ("capital", "energy", "other_opex", "idle"):
        frame[column] = [int(v * NANO) for v in frame[column]]
    frame["device_seconds"] = frame["device_seconds"].astype(np.float64)
    return frame[[*KEYS, "capital", "energy", "other_opex", "idle", "device_seconds"]]


def _unabsorbed(*, start, end, pools) -> pd.DataFrame:
    rows = (
        PoolHourCost.objects.filter(scenario__isnull=True, hour__gte=start, hour__lt=end)
        .values("pool_id")
        .annotate(unabsorbed=Sum("unallocated"))
    )
    return pd.DataFrame(
        [
            {
                "tier": pools[r["pool_id"]][1] if r["pool_id"] else SPARE,
                "pool": pools[r["pool_id"]][0] if r["pool_id"] else SPARE,
                "tenant": UNABSORBED,
                "model": "",
                "unabsorbed": int(r["unabsorbed"] * NANO),
            }
            for r in rows
            if r["unabsorbed"]
        ]
    )


def _tokens(*, start, end, pools, tenants) -> pd.DataFrame:
    models = dict(ServedModel.objects.values_list("pk", "name"))
    rows = usage_tokens_by_tenant_pool_model(start=start, end=end)
    return pd.DataFrame(
        [
            {
                "tier": pools[r["pool_id"]][1] if r["pool_id"] else tenants[r["tenant_id"]][1],
                "pool": pools[r["pool_id"]][0] if r["pool_id"] else "",
                "tenant": tenants[r["tenant_id"]][0],
                "model": models.get(r["served_model_id"], ""),
                "tokens": r["prompt"] + r["completion"],
            }
            for r in rows
        ]
    )


def _capacity(*, start, end, pools) -> pd.DataFrame:
    rows = (
        PoolHourCost.objects.filter(scenario__isnull=True, hour__gte=start, hour__lt=end)
        .values("pool_id")
        .annotate(capacity=Sum("capacity_seconds"), busy=Sum("busy_seconds"))
    )
    frame = pd.DataFrame(
        [
            {
                "tier": pools[r["pool_id"]][1] if r["pool_id"] else SPARE,
                "pool": pools[r["pool_id"]][0] if r["pool_id"] else SPARE,
                "capacity_seconds": float(r["capacity"]),  # ok-float: ratios only
                "busy_seconds": float(r["busy"]),  # ok-float: ratios only
            }
            for r in rows
        ],
        columns=["tier", "pool", "capacity_seconds", "busy_seconds"],
    )
    return frame
