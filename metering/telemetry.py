"""Prometheus gauges of the metering pipeline, computed from the database
on each scrape of the platform's /metrics (a few indexed queries): how far
attribution lags, what waits to be rolled up, and the latest reconciliation
gap per replica."""

from __future__ import annotations

from django.db.models import Max, Min
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from metering.choices import WindowStatus
from metering.models import AttributionWindow, DirtyHour, ReconciliationGap


class MeteringCollector:
    def collect(self):
        now = timezone.now()
        pending = AttributionWindow.objects.filter(status=WindowStatus.PENDING, end__lte=now)
        oldest = pending.aggregate(oldest=Min("end"))["oldest"]
        lag = GaugeMetricFamily(
            "metering_attribution_lag_seconds",
            "Age of the oldest closed window still waiting for attribution (0 when none).",
        )
        lag.add_metric([], (now - oldest).total_seconds() if oldest else 0.0)
        yield lag
        windows = GaugeMetricFamily(
            "metering_windows_pending", "Closed attribution windows waiting to be computed."
        )
        windows.add_metric([], pending.count())
        yield windows
        hours = GaugeMetricFamily("metering_hours_dirty", "Hours whose rollups await a rebuild.")
        hours.add_metric([], DirtyHour.objects.count())
        yield hours

        gap = GaugeMetricFamily(
            "metering_reconciliation_gap_tokens",
            "Latest reconciled window per replica: tokens vLLM counted minus tokens metered.",
            labels=["replica", "kind"],
        )
        latest = ReconciliationGap.objects.values("replica_id").annotate(last=Max("start"))
        rows = ReconciliationGap.objects.filter(
            start__in=[r["last"] for r in latest]
        ).select_related("replica")
        seen = set()
        for row in rows.order_by("replica_id", "-start", "-end"):
            if row.replica_id in seen:
                continue
            seen.add(row.replica_id)
            gap.add_metric([row.replica.name, "prompt"], row.prompt_gap)
            gap.add_metric([row.replica.name, "generation"], row.generation_gap)
        yield gap
