"""The usage rating prices: sums per tenant, model and stretch of
unchanging prices, from the daily totals and the hourly rollups (never
the raw ledger); the span of a tenant's rated hours; and usage of models
a tier has no price for."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

from django.db.models import Case, Count, F, IntegerField, Max, Min, Q, QuerySet, Sum, Value, When

from core.calendar import day_ceil, day_start
from metering.models import UsageDay, UsageRollup


def usage_by_stretch(
    *, start: datetime, end: datetime, edges: list[datetime], tenant_ids: list[int] | None
) -> list[tuple]:
    """Rows of (tenant id, stretch, model id, prompt, cached, completion,
    device-seconds, rollup rows) in [start, end), of rollups with a model,
    ordered by the first three. Stretch n runs from sorted `edges[n]` to the
    next edge. `tenant_ids` None: every tenant. A stretch's whole UTC days
    are read from their daily totals (UsageDay), the hours before its first
    midnight and from its last from the hourly rollups: the same sums from
    about a 24th of the rows, in one statement (one snapshot: a rollup
    rebuild committing meanwhile is seen whole or not at all)."""
    if edges != sorted(edges):
        raise ValueError("edges must be sorted")
    days, hours = Q(pk__in=[]), Q(pk__in=[])
    for lo, hi in _stretches(start, end, edges):
        first, last = day_ceil(lo), day_start(hi)
        if first >= last:
            hours |= Q(hour__gte=lo, hour__lt=hi)
            continue
        days |= Q(day__gte=first, day__lt=last)
        hours |= Q(hour__gte=lo, hour__lt=first) | Q(hour__gte=last, hour__lt=hi)
    tenants = Q() if tenant_ids is None else Q(tenant_id__in=tenant_ids)
    by_day = (
        UsageDay.objects.filter(days, tenants)
        .annotate(segment=_segment("day", edges))
        .values_list("tenant_id", "segment", "served_model_id")
        .annotate(**rated_sums(rows=Sum("rollup_rows")))
        .order_by()
    )
    by_hour = (
        UsageRollup.objects.filter(hours, tenants, served_model__isnull=False)
        .annotate(segment=_segment("hour", edges))
        .values_list("tenant_id", "segment", "served_model_id")
        .annotate(**rated_sums(rows=Count("pk")))
        .order_by()
    )
    sums: dict[tuple, list] = {}
    for key_and_sums in by_day.union(by_hour, all=True):
        key, values = key_and_sums[:3], key_and_sums[3:]
        if key in sums:
            sums[key] = [a + b for a, b in zip(sums[key], values, strict=True)]
        else:
            sums[key] = list(values)
    return [(*key, *sums[key]) for key in sorted(sums)]


def rated_sums(*, rows) -> dict:
    """The sums rating reads of rollups (hourly or daily) as annotations:
    prompt, cached and completion tokens, device-seconds, and `rows` (how
    many hourly rollups they sum)."""
    return {
        "prompt": Sum("prompt_tokens"),
        "cached": Sum("cached_tokens"),
        "completion": Sum("completion_tokens"),
        "seconds": Sum("device_seconds"),
        "rows": rows,
    }


def _stretches(start: datetime, end: datetime, edges: list[datetime]):
    """[lo, hi) of each stretch within [start, end): the first reaches back
    to `start`, the last on to `end`."""
    bounds = [start, *edges[1:], end]
    for lo, hi in pairwise(bounds):
        lo, hi = max(lo, start), min(hi, end)
        if lo < hi:
            yield lo, hi


def _segment(field: str, edges: list[datetime]) -> Case:
    """The stretch a row of `field` (an hour, or a day wholly inside one
    stretch) falls in."""
    return Case(
        *(When(**{f"{field}__lt": edge}, then=Value(n)) for n, edge in enumerate(edges[1:])),
        default=Value(len(edges) - 1),
        output_field=IntegerField(),
    )


def usage_of_models_by_tenant(
    *, start: datetime, end: datetime, tier: str, model_ids: set[int]
) -> QuerySet:
    """Per (tenant slug, model name) of tenants in `tier`: tokens, requests
    and the first and last hour of usage of `model_ids` in [start, end),
    where any tokens were used."""
    return (
        UsageRollup.objects.filter(
            hour__gte=start, hour__lt=end, tenant__tier=tier, served_model_id__in=model_ids
        )
        .values(tenant_slug=F("tenant__slug"), model=F("served_model__name"))
        .annotate(
            tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            requests=Sum(F("requests_ok") + F("requests_aborted") + F("requests_error")),
            first_hour=Min("hour"),
            last_hour=Max("hour"),
        )
        .filter(tokens__gt=0)
    )


def usage_hours_span(
    *, tenant_id: int, start: datetime, end: datetime
) -> tuple[datetime, datetime] | None:
    """The first and last hour of `tenant_id`'s rolled-up usage in [start,
    end) (what rating rates), or None when it has none there."""
    span = UsageRollup.objects.filter(tenant_id=tenant_id, hour__gte=start, hour__lt=end).aggregate(
        first=Min("hour"), last=Max("hour")
    )
    return None if span["first"] is None else (span["first"], span["last"])
