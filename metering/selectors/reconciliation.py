"""Reads for the reconciliation page: the gaps metering.reconciliation
stored per replica and window, what its comparisons could cover, per
replica what its engine's counters can tell, and phases of disaggregated
requests whose other phase never reached the ledger (read from the raw
ledger). Every tenant: finance staff code paths only."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db import connection
from django.db.models import Count, F, Max, Min, Q, Sum
from django.db.models.functions import Coalesce

from metering.models import ReconciliationGap, UsageRollup
from serving.engines import engine_spec
from serving.models import Replica, ReplicaMetricSample


def reconciliation_gaps(*, start: datetime, end: datetime) -> tuple[list, dict]:
    """Windows where vLLM's own token counters and the metered tokens
    disagree (largest first), and the totals over every window compared:
    tokens served but not metered, hence not billed, show as a positive
    gap. A window with fewer than two scrapes compared nothing (no counter
    delta): it is not counted, and it cannot disagree."""
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
