"""A day of one tenant's requests with SLO figures worked by hand, for the
metering selector and billing's compliance, credit and page tests.

`slo_day` records, from `at` on, one second apart:
- 20 completed requests; the k-th (k = 1..20) has its first token 10 k ms
  after the gateway received it and then 10 more tokens over 100 k ms:
  TTFT = 10 k ms, inter-token latency = 100 k / (11 - 1) = 10 k ms.
  p95 of 10, 20, ..., 200 (percentile_cont): rank 0.95 x 19 = 18.05, so
  190 + 0.05 x (200 - 190) = 190.5 ms, for both.
- platform failures: a 503 (no replica), a 502 (upstream broke), a 429
  from the gateway's queue (queue_timeout);
- the tenant's own: a 429 of its concurrency limit and a 400 (not counted);
- a client that went away (499: counted, served).
Counted 20 + 3 + 1 = 24, failed 3: availability 21 / 24 = 87.5 %."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from tenants.models import Tenant
from tests.ledger import Ledger

COMPLETED = 20
TTFT_P95 = "190.500"
ITL_P95 = "190.500"
COUNTED, FAILED = 24, 3


def slo_events(ledger: Ledger, tenant: Tenant, at: datetime, *, prefix: str) -> list[dict]:
    events = []
    for k in range(1, COMPLETED + 1):
        start = at + timedelta(seconds=k)
        first = start + timedelta(milliseconds=10 * k)
        events.append(
            ledger.event(
                f"{prefix}-ok-{k}",
                tenant=tenant,
                at=start,
                completion_tokens=11,
                first_token_at=first,
                ended_at=first + timedelta(milliseconds=100 * k),
            )
        )
    refused = at + timedelta(seconds=30)
    failures = [
        ("503", "error", 503, "r1: connection refused"),
        ("502", "error", 502, "upstream closed the stream"),
        ("qt", "rejected", 429, "queue_timeout: waited 5.000s in the gateway queue (timeout 5s)"),
        ("limit", "rejected", 429, "too many concurrent requests (limit 4)"),
        ("bad", "rejected", 400, "messages: required"),
        ("gone", "aborted", 499, ""),
    ]
    for n, (name, status, http, error) in enumerate(failures):
        start = refused + timedelta(seconds=n)
        events.append(
            ledger.event(
                f"{prefix}-{name}",
                tenant=tenant,
                at=start,
                status=status,
                http_status=http,
                error=error,
                completion_tokens=0,
                first_token_at=None,
                ended_at=start + timedelta(milliseconds=5),
            )
        )
    return events


def slo_day(ledger: Ledger, tenant: Tenant, at: datetime, *, prefix: str = "slo") -> None:
    usage_record_batch(events=slo_events(ledger, tenant, at, prefix=prefix), source=EventSource.API)


# The schedule the billing tests use: availability below its 99.9% target
# 10%, below 99% 25%; TTFT p95 over its 150 ms target 5%. Alpha's day
# (87.5%, 190.5 ms) earns 25% + 5% = 30% of its usage charges.
SCHEDULE = (("availability", None, "10"), ("availability", "99", "25"), ("ttft_p95", None, "5"))


def slo_policy(
    *,
    name: str = "shared default",
    tier: str = "shared",
    plan=None,
    availability: str | None = "99.9",
    ttft: str | None = "150",
    itl: str | None = None,
    cap: str = "100",
    rules=SCHEDULE,
):
    from billing.models import SlaCreditRule, SloPolicy

    policy = SloPolicy.objects.create(
        name=name,
        tier="" if plan is not None else tier,
        plan=plan,
        availability_percent=Decimal(availability) if availability else None,
        ttft_p95_ms=Decimal(ttft) if ttft else None,
        itl_p95_ms=Decimal(itl) if itl else None,
        credit_cap_percent=Decimal(cap),
    )
    for metric, threshold, percent in rules:
        SlaCreditRule.objects.create(
            policy=policy,
            metric=metric,
            threshold=Decimal(threshold) if threshold else None,
            credit_percent=Decimal(percent),
        )
    return policy
