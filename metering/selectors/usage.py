"""A tenant's usage, read from the hourly rollups (never the raw ledger):
the usage pages and the usage export. Every read takes `tenant=`: a
tenant sees its own rows; None means every tenant and is for platform
finance staff code paths only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db.models import F, Max, Min, Q, QuerySet, Sum, Value
from django.db.models.functions import Coalesce, TruncDay, TruncHour, TruncMonth

from core.calendar import months_add
from metering.models import DirtyHour, EnergyHour, UsageRollup
from tenants.models import Tenant

TRUNCATE = {"hour": TruncHour, "day": TruncDay, "month": TruncMonth}
# The longest range one request may cover, by grouping (rows stay bounded).
MAX_RANGE = {"hour": timedelta(days=93), "day": timedelta(days=1100), "month": timedelta(days=3700)}
SUMS = (
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "requests_ok",
    "requests_aborted",
    "requests_error",
    "requests_rejected",
    "device_seconds",
    "gateway_queue_ms_sum",
    "gateway_queue_requests",
    "gateway_queued_requests",
)


@dataclass(frozen=True)
class UsageQuery:
    start: datetime
    end: datetime
    group_by: str = "day"
    model: str | None = None


def _rollups(*, tenant: Tenant | None, query: UsageQuery) -> QuerySet[UsageRollup]:
    rows = UsageRollup.objects.filter(hour__gte=query.start, hour__lt=query.end)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    if query.model:
        rows = rows.filter(served_model__name=query.model)
    return rows


def usage_summary(
    *, tenant: Tenant | None, query: UsageQuery, after: tuple | None = None
) -> QuerySet:
    """Usage per (period, tenant, model), ordered for keyset pagination by
    (period, tenant id, model id); `after` is the last key already seen."""
    period = TRUNCATE[query.group_by]("hour", tzinfo=UTC)
    rows = (
        _rollups(tenant=tenant, query=query)
        .annotate(period=period, model_key=Coalesce("served_model_id", Value(0)))
        .values("period", "tenant_id", "model_key")
        .annotate(
            tenant_slug=F("tenant__slug"),
            model_name=Coalesce("served_model__name", Value("")),
            **{name: Sum(name) for name in SUMS},
        )
        .order_by("period", "tenant_id", "model_key")
    )
    if after is not None:
        period_after, tenant_after, model_after = after
        rows = rows.filter(
            Q(period__gt=period_after)
            | Q(period=period_after, tenant_id__gt=tenant_after)
            | Q(period=period_after, tenant_id=tenant_after, model_key__gt=model_after)
        )
    return rows


def _period_after(period: datetime, group_by: str) -> datetime:
    if group_by == "month":
        return months_add(period, 1)
    return period + (timedelta(hours=1) if group_by == "hour" else timedelta(days=1))


def usage_energy(rows: list[dict], *, query: UsageQuery) -> dict[tuple, tuple]:
    """The energy (kWh) and emissions (gCO2e) of usage_summary's `rows`,
    keyed as they are (period, tenant_id, model_key); a key is absent
    where no energy was computed for it (hours not yet allocated). One
    grouped read over the rows' periods and tenants."""
    if not rows:
        return {}
    first = max(min(r["period"] for r in rows), query.start)
    end = min(_period_after(max(r["period"] for r in rows), query.group_by), query.end)
    found = EnergyHour.objects.filter(
        hour__gte=first, hour__lt=end, tenant_id__in={r["tenant_id"] for r in rows}
    )
    if query.model:
        found = found.filter(served_model__name=query.model)
    grouped = (
        found.annotate(
            period=TRUNCATE[query.group_by]("hour", tzinfo=UTC),
            model_key=Coalesce("served_model_id", Value(0)),
        )
        .values("period", "tenant_id", "model_key")
        .annotate(kwh=Sum("kwh"), co2e_g=Sum("co2e_g"))
    )
    return {(g["period"], g["tenant_id"], g["model_key"]): (g["kwh"], g["co2e_g"]) for g in grouped}


def usage_synthetic_span(
    *, start: datetime, end: datetime, tenant=None
) -> tuple[datetime, datetime] | None:
    """The first and last hour in [start, end) of usage that is synthetic
    hourly totals (the demo's history: rollups with no request behind
    them), for every tenant or one; None when there is none. Pages that
    measure request by request say those days have nothing to measure."""
    rows = UsageRollup.objects.filter(hour__gte=start, hour__lt=end, synthetic=True)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    span = rows.aggregate(first=Min("hour"), last=Max("hour"))
    return None if span["first"] is None else (span["first"], span["last"])


def rollups_complete_before() -> datetime | None:
    """The first hour whose rollups await a rebuild (usage arrived for it
    since the last metering run): the rollups are complete up to it. None
    when every hour is rolled up."""
    return DirtyHour.objects.order_by("hour").values_list("hour", flat=True).first()


def energy_totals(*, tenant: Tenant | None, start: datetime, end: datetime) -> list[dict]:
    """Energy (kWh) and emissions (gCO2e) in [start, end) per (tenant,
    model), with the tokens the same rows served: one tenant's, or (None:
    finance staff only) every tenant's and the idle draw (tenant "", model
    "") beside them."""
    rows = EnergyHour.objects.filter(hour__gte=start, hour__lt=end)
    if tenant is not None:
        rows = rows.filter(tenant=tenant)
    energy = (
        rows.values("tenant_id", "served_model_id")
        .annotate(
            tenant_slug=Coalesce("tenant__slug", Value("")),
            model_name=Coalesce("served_model__name", Value("")),
            kwh=Sum("kwh"),
            co2e_g=Sum("co2e_g"),
        )
        .order_by("tenant_slug", "model_name")
    )
    tokens = {
        (r["tenant_id"], r["served_model_id"]): r["tokens"]
        for r in _rollups(tenant=tenant, query=UsageQuery(start=start, end=end))
        .values("tenant_id", "served_model_id")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    }
    return [
        {
            "tenant": e["tenant_slug"],
            "model": e["model_name"],
            "kwh": e["kwh"],
            "co2e_g": e["co2e_g"],
            "tokens": tokens.get((e["tenant_id"], e["served_model_id"]), 0),
        }
        for e in energy
    ]
