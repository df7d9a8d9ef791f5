"""The gateway's queue as the hourly rollups count it: the time requests
waited there, by tenant tier, and its mean depth hour by hour."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.db.models import F, Sum

from metering.models import UsageRollup

MILLIS = Decimal("0.001")


def gateway_queue_ms_mean(*, total_ms: Decimal, requests: int) -> Decimal | None:
    """The mean time in the gateway's queue of `requests` that waited
    `total_ms` in all, to the microsecond; None when no request recorded one."""
    return (total_ms / requests).quantize(MILLIS) if requests else None


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
