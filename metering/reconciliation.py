"""Reconciliation: per replica and window, the tokens vLLM says it processed
(the deltas of its own Prometheus counters, scraped by serving) against the
tokens metered to tenants in the ledger. A positive gap is tokens served
that nobody was billed for: records lost between a replica and the ledger
(a gateway killed before its buffer was flushed), or requests that bypassed
the gateway. vLLM counts aborted requests too, and so does the ledger (up to
the last relayed chunk), so a healthy gap is near zero."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

from django.conf import settings
from django.db.models import Case, F, Q, Sum, When
from django.utils import timezone

from metering.choices import Phase
from metering.models import ReconciliationGap, UsageEvent
from serving.models import Replica, ReplicaMetricSample

MAX_REQUEST = timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])


@dataclass(frozen=True)
class CounterDelta:
    prompt: int
    generation: int
    samples: int
    first_at: datetime | None
    last_at: datetime | None


def counter_delta(*, replica_id: int, start: datetime, end: datetime) -> CounterDelta:
    """vLLM's token counters over the samples in [start, end], plus the last
    sample before `start` as the baseline. A counter that goes down means the
    replica restarted: its new value is all new tokens."""
    baseline = (
        ReplicaMetricSample.objects.filter(
            replica_id=replica_id, up=True, scraped_at__lt=start, prompt_tokens_total__isnull=False
        )
        .order_by("-scraped_at")
        .values_list("scraped_at", "prompt_tokens_total", "generation_tokens_total")
        .first()
    )
    samples = list(
        ReplicaMetricSample.objects.filter(
            replica_id=replica_id,
            up=True,
            scraped_at__gte=start,
            scraped_at__lte=end,
            prompt_tokens_total__isnull=False,
        )
        .order_by("scraped_at")
        .values_list("scraped_at", "prompt_tokens_total", "generation_tokens_total")
    )
    series = ([baseline] if baseline else []) + samples
    prompt = generation = 0
    for (_, p0, g0), (_, p1, g1) in pairwise(series):
        prompt += p1 - p0 if p1 >= p0 else p1
        generation += g1 - g0 if g1 >= g0 else g1
    return CounterDelta(
        prompt=prompt,
        generation=generation,
        samples=len(series),
        first_at=series[0][0] if series else None,
        last_at=series[-1][0] if series else None,
    )


def reconciliation_compute(
    *, replica: Replica, start: datetime, end: datetime
) -> ReconciliationGap:
    """Compare over the span the samples cover (from the baseline sample to
    the last one in the window): ledger tokens of requests on `replica` that
    ended in that span. Stored (replacing an earlier run of the same window)."""
    delta = counter_delta(replica_id=replica.pk, start=start, end=end)
    metered = {"prompt": 0, "generation": 0}
    if delta.first_at is not None and delta.samples > 1:
        # A Dynamo frontend's counters count every worker behind it: its
        # workers' rows too, each request once (its prompt by its prefill
        # row, its output by its decode row, as metering.rollups bills them).
        workers = list(Replica.objects.filter(front=replica).values_list("pk", flat=True))
        metered = _tokens_ended(
            replica_ids=[replica.pk, *workers],
            behind=workers,
            after=delta.first_at,
            through=delta.last_at,
        )
    gap, _ = ReconciliationGap.objects.update_or_create(
        replica=replica,
        start=start,
        end=end,
        defaults={
            "vllm_prompt_tokens": delta.prompt,
            "vllm_generation_tokens": delta.generation,
            "metered_prompt_tokens": metered["prompt"],
            "metered_generation_tokens": metered["generation"],
            "samples": delta.samples,
            "computed_at": timezone.now(),
        },
    )
    return gap


def _tokens_ended(
    *, replica_ids: list[int], behind: list[int], after: datetime, through: datetime
) -> dict[str, int]:
    """The tokens of requests on `replica_ids` that ended in (after,
    through], not refused; `behind` (a frontend's workers) by their prefill
    row's prompt and their decode row's output. From the ledger, or on the
    scaled path the raw-event store."""
    if settings.USAGE_LOG["URL"]:
        from metering.log.reads import store_tokens_ended

        return store_tokens_ended(
            replica_ids=replica_ids, behind=behind, after=after, through=through
        )
    workers = Q(replica_id__in=behind)
    sums = UsageEvent.objects.filter(
        Q(replica_id__in=replica_ids)
        & Q(ended_at__gt=after, ended_at__lte=through)
        # bounds the partitions scanned: no request outlives MAX_REQUEST_SECONDS
        & Q(received_at__gte=after - MAX_REQUEST)
        & ~Q(status="rejected")
    ).aggregate(
        prompt=Sum(Case(When(workers & Q(phase=Phase.DECODE), then=0), default=F("prompt_tokens"))),
        generation=Sum(
            Case(When(workers & Q(phase=Phase.PREFILL), then=0), default=F("completion_tokens"))
        ),
    )
    return {k: v or 0 for k, v in sums.items()}


def reconciliation_run_hour(*, hour: datetime) -> list[ReconciliationGap]:
    """Every replica over one hour."""
    hour = hour.replace(minute=0, second=0, microsecond=0)
    return [
        reconciliation_compute(replica=replica, start=hour, end=hour + timedelta(hours=1))
        for replica in Replica.objects.filter(front__isnull=True)  # workers: by their frontend
    ]
