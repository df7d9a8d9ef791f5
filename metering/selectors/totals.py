"""Every tenant's usage summed in SQL from the hourly rollups (never the
raw ledger), for billing's allocation, cost and margin reports, so
billing never names a metering table. Every tenant: finance staff code
paths only."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import pandas as pd
from django.db.models import F, Q, QuerySet, Sum

from core.db_frames import query_frame
from metering.models import UsageRollup


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


def demand_frame(*, start: datetime, end: datetime) -> pd.DataFrame:
    """Demand per hour, pool and model in [start, end), as planning reads
    it: (hour epoch, pool_id, model_id, tokens, requests); tokens are
    prompt plus completion, requests every one that reached a replica (ok,
    aborted, error). Hours with none are absent. Summed in PostgreSQL: a
    year of every tenant's rollups comes back as one row per series-hour."""
    return query_frame(
        """
        SELECT extract(epoch FROM hour)::bigint AS hour, pool_id, served_model_id AS model_id,
               sum(prompt_tokens + completion_tokens)::bigint AS tokens,
               sum(requests_ok + requests_aborted + requests_error)::bigint AS requests
        FROM metering_usagerollup
        WHERE hour >= %s AND hour < %s AND pool_id IS NOT NULL AND served_model_id IS NOT NULL
        GROUP BY 1, 2, 3
        """,
        [start, end],
        {
            "hour": np.int64,
            "pool_id": np.int64,
            "model_id": np.int64,
            "tokens": np.int64,
            "requests": np.int64,
        },
    )


def usage_synthetic_share(*, start: datetime, end: datetime) -> float:  # ok-float: a share, shown
    """The share (0 to 1) of the tokens in [start, end)'s rollups that the
    history generator made (metering.history), 0 with none: how much of
    what a forecast read is demo history rather than traffic."""
    sums = UsageRollup.objects.filter(hour__gte=start, hour__lt=end).aggregate(
        total=Sum(F("prompt_tokens") + F("completion_tokens")),
        synthetic=Sum(F("prompt_tokens") + F("completion_tokens"), filter=Q(synthetic=True)),
    )
    if not sums["total"]:
        return 0.0
    return (sums["synthetic"] or 0) / sums["total"]


def replica_load_frame(*, start: datetime, end: datetime) -> pd.DataFrame:
    """Each replica's load and latency per hour in [start, end)
    (metering.models.ReplicaLoadHour): (hour epoch, replica_id, pool_id,
    model_id, requests, tokens, busy_seconds, ttft_p95_ms, itl_p95_ms),
    -1 for a pool or model not named, latencies missing without a sample."""
    return query_frame(
        """
        SELECT extract(epoch FROM hour)::bigint AS hour, replica_id,
               coalesce(pool_id, -1) AS pool_id, coalesce(served_model_id, -1) AS model_id,
               requests, tokens, busy_seconds::float8 AS busy_seconds,
               ttft_p95_ms::float8 AS ttft_p95_ms, itl_p95_ms::float8 AS itl_p95_ms
        FROM metering_replicaloadhour
        WHERE hour >= %s AND hour < %s
        ORDER BY replica_id, hour
        """,
        [start, end],
        {
            "hour": np.int64,
            "replica_id": np.int64,
            "pool_id": np.int64,
            "model_id": np.int64,
            "requests": np.int64,
            "tokens": np.int64,
            "busy_seconds": np.float64,
            "ttft_p95_ms": "Float64",
            "itl_p95_ms": "Float64",
        },
    )


def pool_model_mix(*, start: datetime, end: datetime) -> pd.DataFrame:
    """Per (pool, model) in [start, end): tokens by kind (prompt not read
    from cache, cached prompt, completion) and attributed device-seconds,
    what planning turns a forecast of tokens into device time and revenue
    with."""
    return query_frame(
        """
        SELECT pool_id, served_model_id AS model_id,
               sum(prompt_tokens - cached_tokens)::bigint AS input,
               sum(cached_tokens)::bigint AS cached, sum(completion_tokens)::bigint AS output,
               sum(device_seconds)::float8 AS device_seconds
        FROM metering_usagerollup
        WHERE hour >= %s AND hour < %s AND pool_id IS NOT NULL AND served_model_id IS NOT NULL
        GROUP BY 1, 2
        """,
        [start, end],
        {
            "pool_id": np.int64,
            "model_id": np.int64,
            "input": np.int64,
            "cached": np.int64,
            "output": np.int64,
            "device_seconds": np.float64,
        },
    )


def pool_tenants(*, start: datetime, end: datetime) -> dict[int, set[int]]:
    """The tenants with usage in each pool in [start, end)."""
    out: dict[int, set[int]] = {}
    rows = (
        UsageRollup.objects.filter(hour__gte=start, hour__lt=end, pool_id__isnull=False)
        .values_list("pool_id", "tenant_id")
        .distinct()
    )
    for pool_id, tenant_id in rows:
        out.setdefault(pool_id, set()).add(tenant_id)
    return out


def tenant_token_shares(
    *, tenant_slug: str, start: datetime, end: datetime
) -> dict[tuple, float]:  # ok-float: shares, weights only
    """A tenant's share of each (pool, model)'s tokens in [start, end)."""
    whole: dict[tuple, int] = {}
    mine: dict[tuple, int] = {}
    rows = (
        UsageRollup.objects.filter(
            hour__gte=start, hour__lt=end, pool_id__isnull=False, served_model_id__isnull=False
        )
        .values("pool_id", "served_model_id", "tenant__slug")
        .annotate(tokens=Sum(F("prompt_tokens") + F("completion_tokens")))
    )
    for row in rows:
        key = (row["pool_id"], row["served_model_id"])
        whole[key] = whole.get(key, 0) + row["tokens"]
        if row["tenant__slug"] == tenant_slug:
            mine[key] = mine.get(key, 0) + row["tokens"]
    return {key: mine[key] / whole[key] for key in mine if whole[key]}
