"""Reads of usage, always from the hourly rollups (never the raw ledger).
Every read takes `tenant=`: a tenant sees its own rows; None means every
tenant and is for platform finance staff code paths only. The totals at the
end are billing's reads (allocation, rating, reports): every tenant, summed
in SQL, so billing never names a metering table. SLO figures are the one
read of raw events in bulk: a percentile needs every request, so they are
computed in SQL over the ledger (by its tenant and time index)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import pairwise

import numpy as np
import pandas as pd
from django.db import connection
from django.db.models import Case, Count, F, IntegerField, Max, Min, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce, TruncDay, TruncHour, TruncMonth

from core.calendar import day_ceil, day_start
from core.db_frames import query_frame
from metering.choices import Phase
from metering.models import DirtyHour, RequestShares, UsageDay, UsageEvent, UsageRollup
from serving.choices import RequestStatus
from serving.engines import engine_spec
from serving.models import Replica
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
MILLIS = Decimal("0.001")


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


def gateway_queue_ms_mean(*, total_ms: Decimal, requests: int) -> Decimal | None:
    """The mean time in the gateway's queue of `requests` that waited
    `total_ms` in all, to the microsecond; None when no request recorded one."""
    return (total_ms / requests).quantize(MILLIS) if requests else None


def usage_page(
    *, tenant: Tenant | None, query: UsageQuery, limit: int, cursor: str | None
) -> tuple[list[dict], str | None]:
    """One page of usage_summary and the cursor of the next (None at the end)."""
    after = cursor_decode(cursor) if cursor else None
    rows = list(usage_summary(tenant=tenant, query=query, after=after)[: limit + 1])
    more = len(rows) > limit
    rows = rows[:limit]
    next_cursor = None
    if more:
        last = rows[-1]
        next_cursor = cursor_encode((last["period"], last["tenant_id"], last["model_key"]))
    return rows, next_cursor


def cursor_encode(key: tuple) -> str:
    period, tenant_id, model_key = key
    raw = json.dumps([period.isoformat(), tenant_id, model_key]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def cursor_decode(cursor: str) -> tuple:
    """Raises ValueError for a cursor we did not make."""
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        period, tenant_id, model_key = json.loads(base64.urlsafe_b64decode(padded))
        return datetime.fromisoformat(period), int(tenant_id), int(model_key)
    except (ValueError, TypeError) as exc:
        raise ValueError("not a cursor from this API") from exc


def usage_detail_rows(*, tenant: Tenant | None, query: UsageQuery) -> Iterator[dict]:
    """Usage per (period, tenant, model, pool, replica), streamed from a
    server-side cursor: for exports of any size in constant memory."""
    period = TRUNCATE[query.group_by]("hour", tzinfo=UTC)
    rows = (
        _rollups(tenant=tenant, query=query)
        .annotate(period=period)
        .values(
            "period",
            "tenant__slug",
            "tenant__name",
            "tenant__billing_currency",
            "served_model__name",
            "pool__name",
            "pool__kind",
            "replica__name",
            "priority",
        )
        .annotate(**{name: Sum(name) for name in SUMS})
        .order_by("period", "tenant__slug", "served_model__name", "pool__name", "replica__name")
    )
    return rows.iterator(chunk_size=2000)


def request_device_seconds(*, tenant: Tenant | None, request_id: str) -> dict[datetime, Decimal]:
    """The device-seconds attributed to one request, per window it was
    resident in (empty until its windows are attributed). A tenant's read of
    another tenant's request finds nothing."""
    events = UsageEvent.objects.filter(request_id=request_id)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    seconds: dict[datetime, Decimal] = {}
    # A disaggregated request: each phase on its own replica, added up.
    for event in events.values("replica_id", "received_at", "ended_at"):
        if event["replica_id"] is None:
            continue
        rows = RequestShares.objects.filter(
            window__replica_id=event["replica_id"],
            window__start__gte=event["received_at"] - timedelta(hours=1),
            window__start__lte=event["ended_at"],
            request_ids__contains=[request_id],
        ).select_related("window")
        for row in rows:
            start = row.window.start
            seconds[start] = seconds.get(start, Decimal(0)) + row.as_seconds()[request_id]
    return seconds


def requests_recent(*, tenant: Tenant | None, limit: int = 10) -> list[UsageEvent]:
    """The latest requests (of one tenant, or of all for finance staff): a
    disaggregated one once, by its decode (a prefill that failed, alone)."""
    events = UsageEvent.objects.exclude(phase=Phase.PREFILL, status=RequestStatus.OK)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    return list(events.select_related("tenant").order_by("-received_at")[:limit])


def request_get(*, tenant: Tenant | None, request_id: str) -> UsageEvent:
    """One request from the ledger; another tenant's is DoesNotExist. A
    disaggregated request is read by its decode row (the answer the client
    got), or by its prefill row when no decode followed."""
    events = UsageEvent.objects.filter(request_id=request_id)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    found = events.select_related("tenant").order_by(
        Case(When(phase=Phase.PREFILL, then=Value(1)), default=Value(0))
    )[:1]
    if not found:
        raise UsageEvent.DoesNotExist(request_id)
    return found[0]


def request_billed_tokens(*, tenant: Tenant | None, request_id: str) -> dict[str, int]:
    """One request's tokens as the rollups count them for rating: a
    disaggregated request's prompt on its prefill row, its output on its
    decode row (billed once). Another tenant's request counts nothing."""
    events = UsageEvent.objects.filter(request_id=request_id)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    not_decode, not_prefill = ~Q(phase=Phase.DECODE), ~Q(phase=Phase.PREFILL)
    sums = events.aggregate(
        prompt=Coalesce(Sum("prompt_tokens", filter=not_decode), 0),
        cached=Coalesce(Sum("cached_tokens", filter=not_decode), 0),
        completion=Coalesce(Sum("completion_tokens", filter=not_prefill), 0),
    )
    return {key: int(value) for key, value in sums.items()}


def rollup_of_request(*, event: UsageEvent) -> UsageRollup | None:
    """The hourly rollup row the request was counted in."""
    return UsageRollup.objects.filter(
        hour=event.received_at.replace(minute=0, second=0, microsecond=0),
        tenant_id=event.tenant_id,
        served_model_id=event.served_model_id,
        pool_id=event.pool_id,
        replica_id=event.replica_id,
        priority=event.priority,
    ).first()


def reconciliation_gaps(*, start: datetime, end: datetime) -> tuple[list, dict]:
    """Windows where vLLM's own token counters and the metered tokens
    disagree (largest first), and the totals over every window compared:
    tokens served but not metered, hence not billed, show as a positive
    gap. A window with fewer than two scrapes compared nothing (no counter
    delta): it is not counted, and it cannot disagree."""
    from metering.models import ReconciliationGap

    rows = ReconciliationGap.objects.filter(start__gte=start, start__lt=end, samples__gt=1)
    totals = rows.aggregate(
        vllm_prompt=Coalesce(Sum("vllm_prompt_tokens"), 0),
        vllm_generation=Coalesce(Sum("vllm_generation_tokens"), 0),
        metered_prompt=Coalesce(Sum("metered_prompt_tokens"), 0),
        metered_generation=Coalesce(Sum("metered_generation_tokens"), 0),
    )
    totals["windows"] = rows.count()
    totals["prompt_gap"] = totals["vllm_prompt"] - totals["metered_prompt"]
    totals["generation_gap"] = totals["vllm_generation"] - totals["metered_generation"]
    gaps = (
        rows.annotate(
            prompt_diff=F("vllm_prompt_tokens") - F("metered_prompt_tokens"),
            generation_diff=F("vllm_generation_tokens") - F("metered_generation_tokens"),
        )
        .exclude(prompt_diff=0, generation_diff=0)
        .select_related("replica", "replica__pool")
        .order_by((F("generation_diff") + F("prompt_diff")).desc(), "-start")
    )
    return list(gaps[:200]), totals


def reconciliation_coverage(*, start: datetime, end: datetime) -> dict:
    """Why no window in [start, end) was compared, when none was: whether
    any replica is registered, whether any has token counters to read,
    the scrapes of those counters in the range (first and last), the
    windows computed with fewer than two scrapes, and the first window
    those scrapes could fill (an hour, compared only once it has closed:
    whether it has, by `end`)."""
    from metering.models import ReconciliationGap
    from serving.models import ReplicaMetricSample

    replicas = list(Replica.objects.values_list("engine", flat=True))
    scrapes = ReplicaMetricSample.objects.filter(
        scraped_at__gte=start, scraped_at__lt=end, up=True, prompt_tokens_total__isnull=False
    ).aggregate(count=Count("id"), first=Min("scraped_at"), last=Max("scraped_at"))
    first_window = None
    if scrapes["first"] is not None:
        hour = scrapes["first"].astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        first_window = (hour, hour + timedelta(hours=1))
    return {
        "replicas": len(replicas),
        "replicas_with_counters": sum(engine_spec(e).counters is not None for e in replicas),
        "scrapes": scrapes["count"],
        "first_scrape_at": scrapes["first"],
        "last_scrape_at": scrapes["last"],
        "first_window": first_window,
        "first_window_closed": first_window is not None and first_window[1] <= end,
        "windows_short_of_scrapes": ReconciliationGap.objects.filter(
            start__gte=start, start__lt=end, samples__lte=1
        ).count(),
    }


def reconciliation_by_replica(*, start: datetime, end: datetime) -> list[dict]:
    """Per replica in [start, end): its engine and what its own counters
    can tell (serving.engines), the windows reconciled against them and
    their gaps, and how many of its served requests had no engine timing
    (the gateway's window stood in: their device-seconds are estimates)."""
    from metering.models import ReconciliationGap

    gaps = {
        row["replica_id"]: row
        for row in ReconciliationGap.objects.filter(start__gte=start, start__lt=end)
        .values("replica_id")
        .annotate(
            windows=Count("id", filter=Q(samples__gt=1)),
            prompt_gap=Sum(F("vllm_prompt_tokens") - F("metered_prompt_tokens")),
            generation_gap=Sum(F("vllm_generation_tokens") - F("metered_generation_tokens")),
        )
    }
    served = {
        row["replica_id"]: row
        for row in UsageRollup.objects.filter(
            hour__gte=start, hour__lt=end, replica_id__isnull=False
        )
        .values("replica_id")
        .annotate(
            served=Sum(F("requests_ok") + F("requests_aborted")),
            gateway_timed=Sum("requests_gateway_timed"),
        )
    }
    rows = []
    for replica in Replica.objects.order_by("name"):
        spec = engine_spec(replica.engine)
        gap = gaps.get(replica.pk, {})
        use = served.get(replica.pk, {})
        rows.append(
            {
                "replica": replica.name,
                "engine": replica.get_engine_display(),
                "counters": spec.counters is not None,
                "counters_note": spec.counters_note,
                "windows": gap.get("windows") or 0,
                "prompt_gap": gap.get("prompt_gap") or 0,
                "generation_gap": gap.get("generation_gap") or 0,
                "served": use.get("served") or 0,
                "gateway_timed": use.get("gateway_timed") or 0,
            }
        )
    return rows


# A phase row whose other phase has not come a day later is flagged: its
# tier lost a record, or the request failed between the phases.
PHASE_PAIRING_GRACE = timedelta(days=1)


def phases_unpaired(*, start: datetime, end: datetime, now: datetime | None = None) -> list[dict]:
    """Rows of disaggregated requests received in [start, end), at least
    PHASE_PAIRING_GRACE ago, whose other phase never reached the ledger (a
    prefill that failed ends its request: not flagged). Kept and billed as
    recorded, never dropped: shown for someone to look into."""
    now = now or datetime.now(UTC)
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT e.request_id, e.phase, t.slug, r.name, e.received_at, e.status,
                   e.prompt_tokens, e.completion_tokens
            FROM metering_usageevent e
            JOIN tenants_tenant t ON t.id = e.tenant_id
            LEFT JOIN serving_replica r ON r.id = e.replica_id
            WHERE e.phase <> 'whole' AND e.received_at >= %s AND e.received_at < %s
              AND e.received_at <= %s
              AND NOT (e.phase = 'prefill' AND e.status <> 'ok')
              AND NOT EXISTS (
                  SELECT 1 FROM metering_usagekey k
                  WHERE k.request_id = e.request_id
                    AND k.phase = CASE e.phase WHEN 'prefill' THEN 'decode' ELSE 'prefill' END
              )
            ORDER BY e.received_at
            LIMIT 200
            """,
            [start, end, now - PHASE_PAIRING_GRACE],
        )
        names = ("request_id", "phase", "tenant", "replica", "received_at", "status")
        return [
            dict(zip(names, row[:6], strict=True)) | {"tokens": row[6] + row[7]}
            for row in cursor.fetchall()
        ]


def usage_by_replica(*, start: datetime, end: datetime) -> QuerySet:
    """Billed tokens (prompt and output) and attributed device-seconds per
    replica in [start, end)."""
    return (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end, replica_id__isnull=False)
        .values("replica_id")
        .annotate(
            tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
            device_seconds=Sum("device_seconds"),
        )
    )


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


def usage_by_model_pool_replica(*, start: datetime, end: datetime) -> QuerySet:
    """Billed tokens and attributed device-seconds per (model name, pool
    name, replica) in [start, end), of the rollups that name all three."""
    return (
        UsageRollup.objects.filter(
            hour__gte=start,
            hour__lt=end,
            replica__isnull=False,
            served_model__isnull=False,
            pool__isnull=False,
        )
        .values("served_model__name", "pool__name", "replica_id")
        .annotate(
            device=Sum("device_seconds"),
            tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
        )
    )


def usage_device_frame(*, start: datetime, end: datetime) -> pd.DataFrame:
    """The hourly rollups with device time in [start, end), as read: (hour
    epoch, replica_id, pool_id, tenant, model, device_us), -1 for a missing
    replica, pool or model. One scan, no sort; the caller groups them
    (pandas is faster here than PostgreSQL's sort-based GROUP BY on two cores)."""
    return query_frame(
        """
        SELECT extract(epoch FROM hour)::bigint AS hour,
               coalesce(replica_id, -1) AS replica_id, coalesce(pool_id, -1) AS pool_id,
               tenant_id AS tenant, coalesce(served_model_id, -1) AS model,
               (device_seconds * 1000000)::bigint AS device_us
        FROM metering_usagerollup
        WHERE hour >= %s AND hour < %s AND device_seconds > 0
        """,
        [start, end],
        {
            "hour": np.int64,
            "replica_id": np.int64,
            "pool_id": np.int64,
            "tenant": np.int64,
            "model": np.int64,
            "device_us": np.int64,
        },
    )


def usage_tokens_by_model_pool(*, start: datetime, end: datetime) -> QuerySet:
    """Prompt and completion tokens in [start, end) per (model name, pool
    name), of rollups that have both."""
    return (
        UsageRollup.objects.filter(
            served_model__isnull=False, pool__isnull=False, hour__gte=start, hour__lt=end
        )
        .values("served_model__name", "pool__name")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )


def usage_tokens_by_tenant_pool_model(*, start: datetime, end: datetime) -> QuerySet:
    """Prompt and completion tokens in [start, end) per (tenant id, pool id,
    model id); pool and model may be None."""
    return (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end)
        .values("tenant_id", "pool_id", "served_model_id")
        .annotate(prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    )


def usage_by_tenant_pool_model(*, start: datetime, end: datetime) -> QuerySet:
    """Tokens by kind and device-seconds in [start, end) per (tenant id,
    pool id, model id), of rollups with a model."""
    return (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end, served_model__isnull=False)
        .values("tenant_id", "pool_id", "served_model_id")
        .annotate(
            prompt=Sum("prompt_tokens"),
            cached=Sum("cached_tokens"),
            completion=Sum("completion_tokens"),
            seconds=Sum("device_seconds"),
        )
    )


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


def gateway_queue_by_tier(*, start: datetime, end: datetime) -> list[dict]:
    """Per tenant tier in [start, end), from the hourly rollups: requests,
    how many recorded a gateway queue time and how many of those waited at
    all, the mean wait over those that recorded one and over those that
    waited, and the share that waited (percent, one decimal; None without
    any recorded). Every tenant: finance staff code paths only."""
    rows = (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end)
        .values(tier=F("tenant__tier"))
        .annotate(
            requests=Sum(
                F("requests_ok")
                + F("requests_aborted")
                + F("requests_error")
                + F("requests_rejected")
            ),
            timed=Sum("gateway_queue_requests"),
            queued=Sum("gateway_queued_requests"),
            total_ms=Sum("gateway_queue_ms_sum"),
        )
        .order_by("tier")
    )
    return [
        row
        | {
            "mean_ms": gateway_queue_ms_mean(total_ms=row["total_ms"], requests=row["timed"]),
            "mean_queued_ms": gateway_queue_ms_mean(
                total_ms=row["total_ms"], requests=row["queued"]
            ),
            "queued_pct": (
                (Decimal(100) * row["queued"] / row["timed"]).quantize(Decimal("0.1"))
                if row["timed"]
                else None
            ),
        }
        for row in rows
    ]


def gateway_queue_depth_by_hour(*, start: datetime, end: datetime) -> list[dict]:
    """Per hour and tenant tier in [start, end), the mean number of requests
    waiting in the gateway's queue over the hour, by Little's law: the time
    they waited divided by the hour's length (three decimals). A wait counts
    in the hour its request arrived. Every tenant: finance staff code paths
    only."""
    rows = (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end)
        .values("hour", tier=F("tenant__tier"))
        .annotate(total_ms=Sum("gateway_queue_ms_sum"))
        .order_by("hour", "tier")
    )
    hour_ms = Decimal(3_600_000)
    return [
        {
            "hour": row["hour"],
            "tier": row["tier"],
            "depth": (row["total_ms"] / hour_ms).quantize(Decimal("0.001")),
        }
        for row in rows
    ]


# A request failed for a platform cause: a 5xx (503: no replica could take
# it), or a 429 from the platform's own queue: no replica slot within the
# queue timeout, or the queue full (codes queue_timeout and queue_full at
# the start of its error, or the openings of the messages the gateway
# records for them, gateway/queueing.py). A tenant's own limits
# and budgets (a 429 naming the limit, even after waiting for it; a 402),
# bad requests (other 4xx) and clients that went away (499) are not.
SLO_PLATFORM_FAILURE_SQL = (
    "(e.http_status >= 500 OR (e.http_status = 429 AND e.error ~ '^(queue_timeout|queue_full):'))"
)
# What availability counts: every request but those refused for the
# tenant's own cause (a 4xx other than the platform queue's 429; a client
# that went away, 499, counts as served).
SLO_COUNTED_SQL = f"(e.http_status < 400 OR e.http_status = 499 OR {SLO_PLATFORM_FAILURE_SQL})"
# Per completed request, in ms. TTFT: what the client waited, from the
# gateway receiving the request to the first token (gateway queue, vLLM
# queue and prefill); without first_token_at (another serving tier's
# report), vLLM's queue time plus its time to first token. Inter-token
# latency: the time from the first token to the end over the gaps between
# tokens, (ended_at - first_token_at) / (completion_tokens - 1), or the
# engine's generation time over them without first_token_at (not an
# inference time reported whole, with no TTFT: that holds the prefill too);
# only requests with two tokens or more have a gap.
SLO_TTFT_MS_SQL = (
    "CASE WHEN e.status = 'ok' THEN coalesce("
    "extract(epoch FROM e.first_token_at - e.received_at) * 1000, "
    "coalesce(e.queue_ms, 0) + e.ttft_ms)::float8 END"
)
SLO_ITL_MS_SQL = (
    "CASE WHEN e.status = 'ok' AND e.completion_tokens >= 2 THEN (coalesce("
    "extract(epoch FROM e.ended_at - e.first_token_at) * 1000, "
    "CASE WHEN e.ttft_ms IS NOT NULL THEN e.generation_ms END)"
    " / (e.completion_tokens - 1))::float8 END"
)
SLO_GROUPS = {"tenant": "e.tenant_id", "tier": "t.tier"}


def slo_figures(
    *,
    start: datetime,
    end: datetime,
    tenant_ids: list[int] | None,
    by_day: bool,
    group: str = "tenant",
) -> list[dict]:
    """SLO figures from the ledger over [start, end), per tenant (`group`
    "tenant": key = tenant id) or per tenant tier ("tier": key = tier), and
    per UTC day when `by_day` (else day None): requests counted for
    availability, how many of them failed for a platform cause, how many
    completed with a time to first token, and the 95th percentiles
    (percentile_cont, interpolated) of TTFT and inter-token latency in ms,
    rounded to the microsecond (None without a sample). `tenant_ids` None:
    every tenant (finance staff code paths only); a tenant's read passes
    its own id alone."""
    day = "(e.received_at AT TIME ZONE 'UTC')::date" if by_day else "NULL::date"
    only = "AND e.tenant_id = ANY(%s)" if tenant_ids is not None else ""
    # Only this module's constants are formatted in; values are parameters.
    sql = f"""
        WITH r AS (
            SELECT {SLO_GROUPS[group]} AS key, {day} AS day,
                   {SLO_COUNTED_SQL} AS counted, {SLO_PLATFORM_FAILURE_SQL} AS failed,
                   {SLO_TTFT_MS_SQL} AS ttft_ms, {SLO_ITL_MS_SQL} AS itl_ms
            FROM metering_usageevent e JOIN tenants_tenant t ON t.id = e.tenant_id
            WHERE e.received_at >= %s AND e.received_at < %s {only}
              -- A disaggregated request counts once: by its decode (or by a
              -- prefill that failed, which ended it).
              AND NOT (e.phase = 'prefill' AND e.status = 'ok')
        )
        SELECT key, day,
               count(*) FILTER (WHERE counted) AS requests,
               count(*) FILTER (WHERE failed) AS failed,
               count(ttft_ms) AS timed,
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY ttft_ms))::numeric, 3),
               round((percentile_cont(0.95) WITHIN GROUP (ORDER BY itl_ms))::numeric, 3)
        FROM r GROUP BY key, day ORDER BY key, day
    """  # noqa: S608
    params: list = [start, end]
    if tenant_ids is not None:
        params.append(list(tenant_ids))
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = ["key", "day", "requests", "failed", "timed", "ttft_p95_ms", "itl_p95_ms"]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def rollups_complete_before() -> datetime | None:
    """The first hour whose rollups await a rebuild (usage arrived for it
    since the last metering run): the rollups are complete up to it. None
    when every hour is rolled up."""
    return DirtyHour.objects.order_by("hour").values_list("hour", flat=True).first()


def usage_hours_span(
    *, tenant_id: int, start: datetime, end: datetime
) -> tuple[datetime, datetime] | None:
    """The first and last hour of `tenant_id`'s rolled-up usage in [start,
    end) (what rating rates), or None when it has none there."""
    span = UsageRollup.objects.filter(tenant_id=tenant_id, hour__gte=start, hour__lt=end).aggregate(
        first=Min("hour"), last=Max("hour")
    )
    return None if span["first"] is None else (span["first"], span["last"])
