"""One request followed through metering: its ledger row (read by request
id, one row or a disaggregated request's two), the device-seconds
attribution gave it, the tokens rating counts of it and the hourly rollup
it was counted in; and a tenant's latest requests from the ledger. Every
read takes `tenant=`; None is for finance staff code paths only."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import Case, Q, Sum, Value, When
from django.db.models.functions import Coalesce

from metering.choices import Phase
from metering.models import RequestShares, UsageEvent, UsageRollup
from serving.choices import RequestStatus
from tenants.models import Tenant


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
