"""A plan from a run's forecasts: each replica's capacity at its pool's
SLO (planning.capacity), each pool's GPUs needed and flags with their
money (planning.provisioning), and each tier's and model's price floor
(planning.floors), the month's cost from the cost model
(planning.costs). What the ledger says of the weeks before `as_of`
(LOOKBACK) turns forecast tokens into device time, kinds and revenue.
Amounts are in the reporting currency."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np

from billing.choices import SloMetric
from billing.errors import FxError
from billing.fx import FxTable, reporting_currency
from billing.pricing.rating import price_books
from billing.reports.margins import margin_data
from billing.sla.compliance import Compliance, sla_credits
from billing.sla.policies import slo_policies_at, slo_policies_load
from core.nanos import NANO
from metering.selectors.totals import (
    pool_model_mix,
    pool_tenants,
    replica_load_frame,
    tenant_token_shares,
    usage_synthetic_share,
)
from planning.capacity import Capacity, Slo, capacity_at_slo
from planning.costs import PoolCost, fleet_shape, forecast_costs, replica_device_seconds
from planning.demand import HISTORY_HOURS, SeriesForecast
from planning.floors import KINDS, Floor, Prices, price_floor, token_revenue
from planning.provisioning import UNDER, ModelNeed, PoolNeed, model_need, pool_need, sized_peak
from planning.whatif import gpus_changed, price_changes, tenant_moved
from serving.models import Pool, Replica, Reservation, ServedModel
from tenants.models import Tenant

LOOKBACK = timedelta(weeks=4)
# The demo's synthetic history (demo.history, metering.history) grows each
# tenant's traffic to run its replica near saturation at the daily peak,
# the latency of its load hours far past the SLO there: a plan over it
# finds every pool short of GPUs. Said on the plan, not hidden.
SYNTHETIC_WARNING = (
    "{share:.0f}% of the tokens this plan forecast from are the demo's synthetic history,"
    " made to run each replica near saturation at its daily peak (latency far past the"
    ' SLO there): the pools flagged "under" are so because that history is, not real traffic'
)
CENTS = Decimal("0.01")
HOURS_A_MONTH = Decimal(730)  # a dedicated GPU's monthly fee, by the hour


@dataclass
class ReplicaCapacity:
    replica: Replica
    gpus: float
    slo: Slo
    capacity: Capacity


@dataclass
class PoolPlanned:
    pool: Pool
    need: PoolNeed
    cost: PoolCost | None
    idle_cost: Decimal | None
    credits_at_risk: Decimal | None
    note: str = ""
    revenue: Decimal | None = None  # the month's at today's prices
    margin_percent: Decimal | None = None


@dataclass
class TierFloor:
    tier: str
    model: str
    tokens: dict[str, int]
    today: Prices | None
    floor: Floor | None
    note: str = ""


@dataclass
class Plan:
    currency: str
    capacities: list[ReplicaCapacity] = field(default_factory=list)
    pools: list[PoolPlanned] = field(default_factory=list)
    floors: list[TierFloor] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _money(nano: float) -> Decimal:
    return (Decimal(round(nano)) / NANO).quantize(CENTS, rounding=ROUND_HALF_EVEN)


def pool_slos(*, pools: list[Pool], tenants: dict[int, set[int]], moment: datetime):
    """Each pool's latency targets: the tightest of its tenants' policies,
    or its tier's default where it had no tenant."""
    everyone = Tenant.objects.in_bulk({t for ts in tenants.values() for t in ts})
    policies = slo_policies_at(tenants=list(everyone.values()), moment=moment)
    by_tier = slo_policies_load().by_tier
    out: dict[int, Slo] = {}
    for pool in pools:
        chosen = [policies.get(t) for t in tenants.get(pool.pk, ())] or [by_tier.get(pool.kind)]
        chosen = [p for p in chosen if p is not None]
        ttft = [float(p.ttft_p95_ms) for p in chosen if p.ttft_p95_ms is not None]
        itl = [float(p.itl_p95_ms) for p in chosen if p.itl_p95_ms is not None]
        out[pool.pk] = Slo(min(ttft) if ttft else None, min(itl) if itl else None)
    return out, everyone, policies


def _peak(series: SeriesForecast, band: str) -> float:
    return sized_peak(list(series.forecast.point), series.forecast.bands, band)[0]


def _latency_credit_percent(policy) -> Decimal:
    """What a period with every latency target missed pays under `policy`."""
    if policy is None:
        return Decimal(0)
    missed = {
        m: policy.target(m) * 10 if policy.target(m) is not None else None
        for m in (SloMetric.TTFT_P95, SloMetric.ITL_P95)
    }
    period = Compliance(
        key=0,
        day=None,
        requests=1,
        failed=0,
        timed=1,
        availability=None,
        ttft_p95_ms=missed[SloMetric.TTFT_P95],
        itl_p95_ms=missed[SloMetric.ITL_P95],
        policy=policy,
    )
    return sum((c.percent for c in sla_credits(period)), Decimal(0))


def plan_compute(
    *,
    as_of: datetime,
    horizon: int,
    forecasts: list[SeriesForecast],
    band: str,
    headroom_percent: Decimal,
    target_margin_percent: Decimal,
    what_if: dict | None = None,
) -> Plan:
    """`what_if`: changes to plan with (planning.whatif); None: as things are."""
    what_if = what_if or {}
    end = as_of.replace(minute=0, second=0, microsecond=0)
    start = end - LOOKBACK
    plan = Plan(currency=reporting_currency())
    pools = list(Pool.objects.order_by("kind", "name"))
    pool_by_id = {p.pk: p for p in pools}
    models = dict(ServedModel.objects.values_list("pk", "name"))
    model_ids = {name: pk for pk, name in models.items()}
    replica_gpus, replica_models = fleet_shape()
    replicas = Replica.objects.select_related("pool", "model").in_bulk(list(replica_gpus))
    tenants = pool_tenants(start=start, end=end)
    slos, everyone, policies = pool_slos(pools=pools, tenants=tenants, moment=end)

    # Capacity per replica at its pool's SLO.
    load = replica_load_frame(start=start, end=end)
    by_replica = {int(r): rows for r, rows in load.groupby("replica_id")}
    empty = load.iloc[0:0]
    for pk, replica in sorted(replicas.items(), key=lambda kv: kv[1].name):
        slo = slos.get(replica.pool_id, Slo())
        plan.capacities.append(
            ReplicaCapacity(
                replica,
                replica_gpus[pk],
                slo,
                capacity_at_slo(by_replica.get(pk, empty), slo),
            )
        )

    # The month's demand as device time, and what the fleet costs with it.
    tokens = {(s.pool_id, model_ids.get(s.model, -1)): s for s in forecasts if s.metric == "tokens"}
    if "move_tenant" in what_if:
        move = what_if["move_tenant"]
        target = next(p for p in pools if p.name == move["pool"])
        tokens = tenant_moved(
            tokens,
            shares=tenant_token_shares(tenant_slug=move["tenant"], start=start, end=end),
            to_pool_id=target.pk,
            to_pool=target.name,
        )
    mix = {
        (int(r.pool_id), int(r.model_id)): r
        for r in pool_model_mix(start=start, end=end).itertuples()
    }
    per_token = {
        key: r.device_seconds / max(r.input + r.cached + r.output, 1) for key, r in mix.items()
    }
    device = replica_device_seconds(
        {key: s.forecast.point for key, s in tokens.items()},
        seconds_per_token=per_token,
        replica_gpus=replica_gpus,
        replica_models=replica_models,
        start=end,
    )
    try:
        costs = forecast_costs(
            start=end,
            hours=horizon,
            device=device,
            replica_pools={r: placed[0] for r, placed in replica_models.items()},
        )
    except FxError as exc:
        costs = {}
        plan.warnings.append(f"no cost forecast: {exc}")
    for change in what_if.get("gpus", []):
        pool = next(p for p in pools if p.name == change["pool"])
        if pool.pk in costs:
            costs[pool.pk] = gpus_changed(costs[pool.pk], int(change["delta"]), hours=horizon)

    _plan_pools(
        plan,
        pools,
        tokens,
        models,
        band,
        headroom_percent,
        costs,
        horizon,
        (start, end),
        ({t.slug: t for t in everyone.values()}, policies),
    )
    synthetic = usage_synthetic_share(start=end - timedelta(hours=HISTORY_HOURS), end=end)
    if synthetic > 0 and any(UNDER in p.need.flags for p in plan.pools):
        plan.warnings.append(SYNTHETIC_WARNING.format(share=synthetic * 100))
    _plan_floors(
        plan,
        pool_by_id,
        tokens,
        mix,
        per_token,
        costs,
        models,
        horizon,
        end,
        target_margin_percent,
        price_changes(what_if),
    )
    return plan


def _reserved_gpus(moment: datetime) -> dict[int, float]:
    """The GPUs reserved in each pool by the reservations in force at `moment`."""
    reserved: dict[int, float] = defaultdict(float)
    for pool_id, gpus in Reservation.objects.filter(start__lte=moment, end__gt=moment).values_list(
        "pool_id", "gpu_count"
    ):
        reserved[pool_id] += gpus
    return reserved


def _pool_revenue(plan: Plan, *, start: datetime, end: datetime) -> dict[tuple, int] | None:
    """Revenue (nano, reporting currency) per (pool name, tenant slug) over [start, end)."""
    try:
        detail = margin_data(start=start, end=end, currency=plan.currency).detail
    except FxError as exc:
        plan.warnings.append(f"no SLA credits at risk: {exc}")
        return None
    sums = detail.groupby(["pool", "tenant"])["revenue"].sum()
    return {key: int(value) for key, value in sums.items()}


def _plan_pools(plan, pools, tokens, models, band, headroom, costs, horizon, window, tenants):
    start, end = window
    capacities: dict[tuple, list] = defaultdict(list)
    sizes: dict[tuple, list] = defaultdict(list)
    for rc in plan.capacities:
        key = (rc.replica.pool_id, rc.replica.model_id)
        sizes[key].append(rc.gpus)
        if rc.capacity.plannable:
            capacities[key].append((rc.capacity.tokens_per_hour, rc.gpus))
    contracted = _reserved_gpus(end)
    revenue: dict | None = None
    revenue_read = False  # read once, and only when a pool is under
    everyone, policies = tenants
    for pool in pools:
        needs: list[ModelNeed] = [
            model_need(
                model=models.get(model_id, str(model_id)),
                peak=_peak(series, band),
                headroom_percent=float(headroom),
                capacities=capacities[(pool.pk, model_id)],
                replica_gpus=sizes[(pool.pk, model_id)],
            )
            for (pool_id, model_id), series in sorted(tokens.items())
            if pool_id == pool.pk
        ]
        cost = costs.get(pool.pk)
        held = (
            cost.gpus
            if cost
            else sum(g for (p, _), gs in sizes.items() if p == pool.pk for g in gs)
        )
        in_replicas = sum(g for (p, _), gs in sizes.items() if p == pool.pk for g in gs)
        need = pool_need(
            gpus_held=held,
            models=needs,
            contracted=contracted.get(pool.pk, 0.0) if pool.kind == "reserved" else None,
            gpus_unplaced=max(0.0, held - in_replicas),
        )
        idle = None
        if cost is not None and need.gpus_surplus is not None:
            idle = _money(need.gpus_surplus * cost.per_gpu_hour_nano * horizon)
        credits: Decimal | None = Decimal(0)
        if UNDER in need.flags and not revenue_read:
            revenue, revenue_read = _pool_revenue(plan, start=start, end=end), True
        if UNDER in need.flags and revenue is None:
            credits = None  # the revenue could not be read: the run's warnings say why
        elif UNDER in need.flags:
            scale = Decimal(horizon) / Decimal(int((end - start).total_seconds() // 3600))
            credits = Decimal(0)
            for (pool_name, slug), nano in revenue.items():
                tenant = everyone.get(slug)
                if pool_name != pool.name or tenant is None:
                    continue
                percent = _latency_credit_percent(policies.get(tenant.pk))
                credits += Decimal(nano) / NANO * scale * percent / 100
            credits = credits.quantize(CENTS, rounding=ROUND_HALF_EVEN)
        plan.pools.append(PoolPlanned(pool, need, cost, idle, credits))


def _today_prices(
    tier: str, model_id: int, *, moment: datetime, currency: str, percent: Decimal | None = None
):
    """Today's list prices of a tier's model (volume tiers aside), changed
    by `percent` (a what-if), and its book's reservation and dedicated
    fees, in `currency`; None without one."""
    books = price_books(tier=tier, currency=currency, start=moment, end=moment + timedelta(hours=1))
    book = books.at(moment)
    price = books.price(book, model_id) if book else None
    if price is None:
        return None
    rate = Decimal(1)
    if book.currency != currency:
        table = FxTable.load(
            currencies={book.currency, currency}, first=moment.date(), last=moment.date()
        )
        rate = table.day_rate(base=book.currency, quote=currency, day=moment.date())[0]
    changed = rate * (1 + Decimal(percent) / 100) if percent is not None else rate
    prices = Prices(
        price.input_per_mtok * changed,
        price.cached_input_per_mtok * changed,
        price.output_per_mtok * changed,
    )
    return prices, book.reservation_per_gpu_hour * rate, book.dedicated_per_gpu_month * rate


def _plan_floors(plan, pools, tokens, mix, per_token, costs, models, horizon, end, target, prices):
    """Each (pool, model)'s month: tokens by kind (today's mix), its share
    of the pool's cost (by forecast device time) and of the fees; summed
    per tier and model into floors, and per pool into revenue and margin
    at today's prices (`prices`: (tier, model) -> percent change, what-ifs)."""
    device: dict[int, float] = defaultdict(float)
    months = {}
    for (pool_id, model_id), series in tokens.items():
        total = float(np.clip(series.forecast.point, 0, None).sum())
        months[(pool_id, model_id)] = total
        device[pool_id] += total * per_token.get((pool_id, model_id), 0.0)
    reserved = _reserved_gpus(end)
    tiers: dict[tuple, dict] = {}
    parts: dict[tuple, dict] = {}
    for (pool_id, model_id), total in sorted(months.items()):
        pool = pools.get(pool_id)
        if pool is None:
            continue
        m = mix.get((pool_id, model_id))
        kinds = {"input": m.input, "cached": m.cached, "output": m.output} if m else {}
        whole = sum(kinds.values()) or 1
        share = (
            total * per_token.get((pool_id, model_id), 0.0) / device[pool_id]
            if device[pool_id]
            else 0.0
        )
        cost = costs.get(pool_id)
        part = {
            "tokens": {
                kind: round(total * kinds.get(kind, whole if kind == "input" else 0) / whole)
                for kind in KINDS
            },
            "cost": cost.cost_nano * share if cost is not None else 0.0,
            "reserved": reserved.get(pool_id, 0.0) * horizon * share,
            "dedicated": cost.gpus * horizon * share
            if pool.kind == "dedicated" and cost is not None
            else 0.0,
        }
        parts[(pool_id, model_id)] = part
        acc = tiers.setdefault(
            (pool.kind, model_id),
            {"tokens": dict.fromkeys(KINDS, 0), "cost": 0.0, "reserved": 0.0, "dedicated": 0.0},
        )
        for kind in KINDS:
            acc["tokens"][kind] += part["tokens"][kind]
        for key in ("cost", "reserved", "dedicated"):
            acc[key] += part[key]
    found: dict[tuple, tuple | str] = {}
    for tier, model_id in tiers:
        try:
            found[(tier, model_id)] = (
                _today_prices(
                    tier,
                    model_id,
                    moment=end,
                    currency=plan.currency,
                    percent=prices.get((tier, models.get(model_id))),
                )
                or "no price today"
            )
        except FxError as exc:
            found[(tier, model_id)] = str(exc)
    for (tier, model_id), acc in sorted(
        tiers.items(), key=lambda kv: (kv[0][0], models.get(kv[0][1], ""))
    ):
        name = models.get(model_id, str(model_id))
        priced = found[(tier, model_id)]
        if isinstance(priced, str):
            plan.floors.append(TierFloor(tier, name, acc["tokens"], None, None, priced))
            continue
        floor = price_floor(
            tokens=acc["tokens"],
            cost_nano=round(acc["cost"]),
            fees_nano=_fees_nano(acc, priced),
            today=priced[0],
            target_percent=target,
        )
        plan.floors.append(TierFloor(tier, name, acc["tokens"], priced[0], floor))
    _pools_revenue(plan, pools, parts, found)
    idle_pools = [p.name for pid, p in pools.items() if pid in costs and not device.get(pid)]
    if idle_pools:
        plan.warnings.append(
            "no forecast demand, their cost in no floor: " + ", ".join(sorted(idle_pools))
        )


def _fees_nano(part: dict, priced: tuple) -> int:
    _prices, per_reserved_hour, per_dedicated_month = priced
    fees = (
        Decimal(part["reserved"]) * per_reserved_hour
        + Decimal(part["dedicated"]) * per_dedicated_month / HOURS_A_MONTH
    )
    return int(fees * NANO)


def _pools_revenue(plan: Plan, pools, parts: dict, found: dict) -> None:
    """Each pool's forecast revenue at today's prices (tokens and fees) and
    its margin against its month's cost; None where a model has no price."""
    for planned in plan.pools:
        mine = [(m, part) for (p, m), part in parts.items() if p == planned.pool.pk]
        revenue = Decimal(0)
        for model_id, part in mine:
            priced = found.get((planned.pool.kind, model_id))
            if priced is None or isinstance(priced, str):
                revenue = None
                break
            revenue += token_revenue(part["tokens"], priced[0])
            revenue += Decimal(_fees_nano(part, priced)) / NANO
        if revenue is None or planned.cost is None:
            continue
        planned.revenue = revenue.quantize(CENTS, rounding=ROUND_HALF_EVEN)
        cost = Decimal(planned.cost.cost_nano) / NANO
        if revenue:
            planned.margin_percent = ((revenue - cost) * 100 / revenue).quantize(Decimal("0.1"))
