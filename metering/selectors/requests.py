"""One request followed through metering: its ledger row (read by request
id, one row or a disaggregated request's two), the device-seconds
attribution gave it, the tokens rating counts of it and the hourly rollup
it was counted in; and a tenant's latest requests. Raw rows come from the
ledger, or on the scaled path from the raw-event store (metering.log.reads):
the same model instances either way. Every read takes `tenant=`; None is
for finance staff code paths only."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db.models import Case, Value, When

from metering.choices import Phase
from metering.models import RequestShares, UsageEvent, UsageRollup
from serving.choices import RequestStatus
from tenants.models import Tenant


def _scaled() -> bool:
    return bool(settings.USAGE_LOG["URL"])


def request_events(*, tenant: Tenant | None, request_id: str) -> list[UsageEvent]:
    """One request's raw rows (a disaggregated request's two, its decode
    first); another tenant's request has none."""
    if _scaled():
        from metering.log.reads import store_request_events

        found = store_request_events(
            request_id=request_id, tenant_id=tenant.pk if tenant is not None else None
        )
        return sorted(found, key=lambda e: e.phase == Phase.PREFILL)
    events = UsageEvent.objects.filter(request_id=request_id)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    return list(
        events.select_related("tenant").order_by(
            Case(When(phase=Phase.PREFILL, then=Value(1)), default=Value(0))
        )
    )


def request_device_seconds(
    *, tenant: Tenant | None, request_id: str, events: list[UsageEvent] | None = None
) -> dict[datetime, Decimal]:
    """The device-seconds attributed to one request, per window it was
    resident in (empty until its windows are attributed). A tenant's read of
    another tenant's request finds nothing. `events`: its rows, when read."""
    if events is None:
        events = request_events(tenant=tenant, request_id=request_id)
    seconds: dict[datetime, Decimal] = {}
    # A disaggregated request: each phase on its own replica, added up.
    for event in events:
        if event.replica_id is None:
            continue
        rows = RequestShares.objects.filter(
            window__replica_id=event.replica_id,
            window__start__gte=event.received_at - timedelta(hours=1),
            window__start__lte=event.ended_at,
            request_ids__contains=[request_id],
        ).select_related("window")
        for row in rows:
            start = row.window.start
            seconds[start] = seconds.get(start, Decimal(0)) + row.as_seconds()[request_id]
    return seconds


def requests_recent(*, tenant: Tenant | None, limit: int = 10) -> list[UsageEvent]:
    """The latest requests (of one tenant, or of all for finance staff): a
    disaggregated one once, by its decode (a prefill that failed, alone)."""
    if _scaled():
        from metering.log.reads import store_requests_recent

        return store_requests_recent(
            tenant_id=tenant.pk if tenant is not None else None, limit=limit
        )
    events = UsageEvent.objects.exclude(phase=Phase.PREFILL, status=RequestStatus.OK)
    if tenant is not None:
        events = events.filter(tenant=tenant)
    return list(events.select_related("tenant").order_by("-received_at")[:limit])


def request_get(*, tenant: Tenant | None, request_id: str) -> UsageEvent:
    """One request; another tenant's is DoesNotExist. A disaggregated
    request is read by its decode row (the answer the client got), or by
    its prefill row when no decode followed."""
    found = request_events(tenant=tenant, request_id=request_id)
    if not found:
        raise UsageEvent.DoesNotExist(request_id)
    return found[0]


def request_billed_tokens(
    *, tenant: Tenant | None, request_id: str, events: list[UsageEvent] | None = None
) -> dict[str, int]:
    """One request's tokens as the rollups count them for rating: a
    disaggregated request's prompt on its prefill row, its output on its
    decode row (billed once). Another tenant's request counts nothing."""
    if events is None:
        events = request_events(tenant=tenant, request_id=request_id)
    prompted = [e for e in events if e.phase != Phase.DECODE]
    answered = [e for e in events if e.phase != Phase.PREFILL]
    return {
        "prompt": sum(e.prompt_tokens for e in prompted),
        "cached": sum(e.cached_tokens for e in prompted),
        "completion": sum(e.completion_tokens for e in answered),
    }


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
