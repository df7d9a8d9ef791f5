"""Writes of webhooks: endpoints, events (emitted once, in the caller's
transaction), deliveries and their attempts, email alert opt-outs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

import httpx
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import EmailMessage, get_connection
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from core.db_copy import instances_create
from core.errors import InputError
from core.queueing import after_commit, task_send
from tenants.choices import KEY_MANAGER_ROLES
from tenants.models import Membership, Tenant
from webhooks.addresses import (
    AddressRefused,
    endpoint_url_check,
    endpoint_url_pinned,
    pinned_async_transport,
)
from webhooks.choices import TENANT_EVENTS, DeliveryStatus, EventType
from webhooks.models import AlertOptOut, Delivery, DeliveryAttempt, Endpoint, Event
from webhooks.signing import secret_generate, signed_headers

logger = logging.getLogger(__name__)
DELIVER_TASK = "webhooks.deliver"  # its name in webhooks.tasks
# First attempts queued together, one message per this many (an invoice
# run's thousands); every retry is a message of its own.
DELIVERIES_PER_TASK = 50
DESCRIPTION_MAX = Endpoint._meta.get_field("description").max_length


def _event_types_check(event_types: Iterable[str] | None, *, tenant: Tenant | None) -> list[str]:
    chosen = sorted(set(event_types or []))
    if not chosen:
        raise InputError("event_types", "choose at least one event")
    allowed = EventType.values if tenant is None else [str(t) for t in TENANT_EVENTS]
    refused = [t for t in chosen if t not in allowed]
    if refused:
        raise InputError(
            "event_types",
            f"{refused[0]!r} is not an event {'here' if tenant is None else 'a tenant may hear'}; "
            f"choose from {', '.join(allowed)}",
        )
    return chosen


def _description_check(description: str | None) -> str:
    description = (description or "").strip()
    if len(description) > DESCRIPTION_MAX:
        raise InputError("description", f"must be at most {DESCRIPTION_MAX} characters")
    return description


def endpoint_create(
    *,
    tenant: Tenant | None,
    url: str,
    event_types: Iterable[str],
    description: str = "",
    created_by: AbstractBaseUser | None = None,
) -> Endpoint:
    """A tenant's endpoint, or the operator's (tenant None), with a new
    signing secret. Checked before anything is written; a tenant holds at
    most WEBHOOKS_MAX_ENDPOINTS (each is work for the delivery workers)."""
    limit = settings.WEBHOOKS["MAX_ENDPOINTS"]
    if tenant is not None and Endpoint.objects.filter(tenant=tenant).count() >= limit:
        raise InputError("url", f"a tenant holds at most {limit} endpoints: delete one first")
    return Endpoint.objects.create(
        tenant=tenant,
        url=endpoint_url_check(url),
        event_types=_event_types_check(event_types, tenant=tenant),
        description=_description_check(description),
        secret=secret_generate(),
        created_by=created_by,
    )


def endpoint_update(
    *,
    endpoint: Endpoint,
    url: str | None = None,
    event_types: Iterable[str] | None = None,
    description: str | None = None,
    active: bool | None = None,
) -> Endpoint:
    if url is not None:
        endpoint.url = endpoint_url_check(url)
    if event_types is not None:
        endpoint.event_types = _event_types_check(event_types, tenant=endpoint.tenant)
    if description is not None:
        endpoint.description = _description_check(description)
    if active is not None:
        endpoint.active = active
    endpoint.save()
    return endpoint


def endpoint_delete(*, endpoint: Endpoint) -> None:
    endpoint.delete()


def _event_id() -> str:
    """Sortable by time, unique: evt_ + milliseconds + 64 random bits."""
    return f"evt_{int(time.time() * 1000):012x}{secrets.token_hex(8)}"


@dataclass(frozen=True)
class EventDraft:
    """An event to emit (events_emit): `key` makes it once."""

    type: str
    tenant: Tenant | None
    key: str
    summary: str
    data: dict
    detail: str = ""


def event_emit(
    *,
    type: EventType,
    tenant: Tenant | None,
    key: str,
    summary: str,
    data: dict,
    detail: str = "",
) -> Event | None:
    """One event (events_emit); None if its key was emitted before."""
    emitted = events_emit([EventDraft(type, tenant, key, summary, data, detail)])
    return emitted[0] if emitted else None


def events_emit(drafts: list[EventDraft]) -> list[Event]:
    """Record that these happened, each once per key (those emitted before
    are skipped), in the caller's transaction and in a fixed number of
    queries however many (an invoice run finalizes thousands). After the
    commit each listening endpoint's delivery is queued, and for a
    tenant's event its owners and admins are emailed (unless opted out).
    Returns the events new here."""
    if not drafts:
        return []
    rows = {}
    for draft in drafts:
        rows.setdefault(draft.key[:200], draft)
    ids = {key: _event_id() for key in rows}
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO webhooks_event (id, type, tenant_id, key, summary, detail, data, "
            "created_at) SELECT * FROM unnest(%s::text[], %s::text[], %s::bigint[], %s::text[], "
            "%s::text[], %s::text[], %s::jsonb[], %s::timestamptz[]) "
            "ON CONFLICT (key) DO NOTHING RETURNING key",
            [
                [ids[k] for k in rows],
                [d.type for d in rows.values()],
                [d.tenant.pk if d.tenant else None for d in rows.values()],
                list(rows),
                [d.summary[:300] for d in rows.values()],
                [d.detail for d in rows.values()],
                [json.dumps(d.data, cls=DjangoJSONEncoder) for d in rows.values()],
                [timezone.now()] * len(rows),
            ],
        )
        new_keys = {key for (key,) in cursor.fetchall()}
    events = list(
        Event.objects.filter(key__in=new_keys).select_related("tenant").order_by("created_at", "id")
    )
    _deliveries_create(events)
    _alert_emails(events)
    return events


def _deliveries_create(events: list[Event]) -> None:
    types = {e.type for e in events}
    tenant_ids = {e.tenant_id for e in events if e.tenant_id}
    listening: dict[int | None, list[Endpoint]] = defaultdict(list)  # by tenant; None: operator's
    for endpoint in Endpoint.objects.filter(
        Q(tenant=None) | Q(tenant_id__in=tenant_ids), active=True, event_types__overlap=list(types)
    ):
        listening[endpoint.tenant_id].append(endpoint)
    now = timezone.now()
    deliveries = [
        Delivery(event=event, endpoint=endpoint, next_attempt_at=now)
        for event in events
        for endpoint in listening[None] + (listening[event.tenant_id] if event.tenant_id else [])
        if event.type in endpoint.event_types
    ]
    instances_create(Delivery, deliveries, connection)  # an invoice run's thousands, by COPY
    for start in range(0, len(deliveries), DELIVERIES_PER_TASK):
        ids = [d.pk for d in deliveries[start : start + DELIVERIES_PER_TASK]]
        task_send(DELIVER_TASK, ids, what=f"{len(ids)} deliveries from {ids[0]}")


def _alert_emails(events: list[Event]) -> None:
    alerting = [e for e in events if e.tenant_id and e.type in TENANT_EVENTS]
    if not alerting:
        return
    tenant_ids = {e.tenant_id for e in alerting}
    out = set(
        AlertOptOut.objects.filter(tenant_id__in=tenant_ids).values_list(
            "user_id", "tenant_id", "event_type"
        )
    )
    members = Membership.objects.filter(tenant_id__in=tenant_ids, role__in=KEY_MANAGER_ROLES)
    people = [
        (m.tenant_id, m.user_id, m.user.email)
        for m in members.select_related("user")
        if m.user.email
    ]
    messages, unheard = [], []
    for event in alerting:
        emails = sorted(
            {
                email
                for tenant_id, user_id, email in people
                if tenant_id == event.tenant_id and (user_id, tenant_id, event.type) not in out
            }
        )
        if not emails:
            unheard.append(event.tenant.slug)
            continue
        body = event.detail or event.summary
        messages.append(EmailMessage(event.summary, body, settings.DEFAULT_FROM_EMAIL, emails))
    if unheard:
        logger.info(
            "%d alert(s) had no owner or admin with an email to send to: %s",
            len(unheard),
            ", ".join(sorted(set(unheard))[:20]),
        )
    if messages:  # one connection to the mail server for the lot (an invoice run's thousand)
        after_commit(
            lambda: get_connection(fail_silently=False).send_messages(messages),
            what=f"{len(messages)} alert email(s) ({messages[0].subject}…)",
        )


def alert_opt_out_set(
    *, user: AbstractBaseUser, tenant: Tenant, emailed: Iterable[str]
) -> list[str]:
    """The event types `user` is emailed about at `tenant`: exactly
    `emailed`; every other tenant event is opted out. Returns the opt-outs."""
    emailed = set(emailed)
    unknown = sorted(emailed - {str(t) for t in TENANT_EVENTS})
    if unknown:
        raise InputError("emailed", f"{unknown[0]!r} is not an event a tenant hears")
    out = [str(t) for t in TENANT_EVENTS if t not in emailed]
    with transaction.atomic():
        AlertOptOut.objects.filter(user=user, tenant=tenant).exclude(event_type__in=out).delete()
        AlertOptOut.objects.bulk_create(
            [AlertOptOut(user=user, tenant=tenant, event_type=t) for t in out],
            ignore_conflicts=True,
        )
    return out


def event_body(event: Event) -> str:
    """The payload every attempt sends, byte for byte the same."""
    return json.dumps(
        {
            "id": event.id,
            "type": event.type,
            "timestamp": event.created_at.isoformat(),
            "tenant": event.tenant.slug if event.tenant_id else None,
            "summary": event.summary,
            "data": event.data,
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def delivery_attempt(*, delivery_id: int, now: datetime | None = None) -> DeliveryAttempt | None:
    """POST the delivery's event once, if it is due and nobody else is at
    it (claimed first, in a transaction of its own); then done, or
    the next try scheduled by the backoff (WEBHOOKS_RETRY_SECONDS), or
    failed when those are used up. None: not due, or already done."""
    now = now or timezone.now()
    rules = settings.WEBHOOKS
    # Claimed in a short transaction of its own: no lock nor transaction is
    # held across the network call (a slow endpoint held both, issue 60).
    # The claim is its next try moved past this attempt's deadline, so a
    # second worker finds it early and leaves it.
    with transaction.atomic():
        delivery = (
            Delivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("event__tenant", "endpoint")
            .filter(pk=delivery_id, status=DeliveryStatus.PENDING)
            .first()
        )
        if delivery is None:
            return None
        if delivery.next_attempt_at and delivery.next_attempt_at > now + timedelta(seconds=1):
            return None  # early: the task queued for its time comes later (or it is claimed)
        claim = now + timedelta(seconds=rules["ATTEMPT_DEADLINE_SECONDS"] + 60)
        Delivery.objects.filter(pk=delivery.pk).update(next_attempt_at=claim)
    attempt = _post(delivery, now)
    with transaction.atomic():
        delivery.attempts, delivery.requested_by = delivery.attempts + 1, ""
        schedule = settings.WEBHOOKS["RETRY_SECONDS"]
        if attempt.status_code is not None and 200 <= attempt.status_code < 300:
            delivery.status, delivery.delivered_at = DeliveryStatus.SUCCEEDED, now
            delivery.next_attempt_at = None
        elif delivery.attempts > len(schedule):
            delivery.status, delivery.next_attempt_at = DeliveryStatus.FAILED, None
        else:
            wait = float(schedule[delivery.attempts - 1])
            delivery.next_attempt_at = now + timedelta(seconds=wait)
            task_send(DELIVER_TASK, delivery.pk, countdown=wait, what=f"retry of {delivery}")
        delivery.save(
            update_fields=["status", "attempts", "next_attempt_at", "delivered_at", "requested_by"]
        )
    return attempt


def _post(delivery: Delivery, now: datetime) -> DeliveryAttempt:
    body = event_body(delivery.event)
    code, excerpt, error = None, "", ""
    started = time.monotonic()
    headers = signed_headers(
        secret=delivery.endpoint.secret, event_id=delivery.event.id, at=now, body=body
    )
    try:
        host, address = endpoint_url_pinned(delivery.endpoint.url)
        code, excerpt = attempt_post(
            delivery.endpoint.url, host=host, address=address, body=body, headers=headers
        )
    except AddressRefused as refused:
        error = f"not sent: {refused.message}"[:300]
    except httpx.HTTPError as failure:
        error = f"{type(failure).__name__}: {failure}"[:300]
    except TimeoutError:
        deadline = settings.WEBHOOKS["ATTEMPT_DEADLINE_SECONDS"]
        error = f"no whole answer within the attempt's {deadline:g} s"
    return DeliveryAttempt.objects.create(
        delivery=delivery,
        at=now,
        status_code=code,
        latency_ms=int((time.monotonic() - started) * 1000),
        error=error,
        body_sha256=hashlib.sha256(body.encode()).hexdigest(),
        response_excerpt=excerpt,
        by=delivery.requested_by,
    )


# What is read of an endpoint's answer: the excerpt kept is 500 characters.
RESPONSE_READ_BYTES = 64 * 1024


def attempt_post(url: str, *, host: str, address: str, body: str, headers: dict) -> tuple[int, str]:
    """POST `body` to `url` at the pinned `address`: (status, the start of
    the answer). Bounded whole, not per read: the attempt ends at
    WEBHOOKS_ATTEMPT_DEADLINE_SECONDS however slowly the endpoint trickles
    (TimeoutError), and at most RESPONSE_READ_BYTES of the answer are read,
    however much it sends."""
    rules = settings.WEBHOOKS

    async def post() -> tuple[int, str]:
        async with (
            httpx.AsyncClient(
                transport=pinned_async_transport(host, address),
                timeout=rules["TIMEOUT_SECONDS"],
                follow_redirects=False,
            ) as client,
            client.stream("POST", url, content=body.encode(), headers=headers) as response,
        ):
            read = b""
            async for chunk in response.aiter_raw():
                read += chunk
                if len(read) >= RESPONSE_READ_BYTES:
                    break
            return response.status_code, read[:RESPONSE_READ_BYTES].decode(errors="replace")[:500]

    async def bounded() -> tuple[int, str]:
        return await asyncio.wait_for(post(), timeout=rules["ATTEMPT_DEADLINE_SECONDS"])

    return asyncio.run(bounded())


def delivery_redeliver(*, delivery: Delivery, by: str) -> Delivery:
    """Send again now, whatever became of it (a receiver that lost it, or
    one fixed after the retries ran out): a new round of retries. The
    receiver sees the same event id and dedupes."""
    with transaction.atomic():
        delivery = Delivery.objects.select_for_update().get(pk=delivery.pk)
        delivery.status, delivery.attempts = DeliveryStatus.PENDING, 0
        delivery.next_attempt_at, delivery.requested_by = timezone.now(), by[:150]
        delivery.save(update_fields=["status", "attempts", "next_attempt_at", "requested_by"])
        task_send(DELIVER_TASK, delivery.pk, what=f"redelivery of {delivery} by {by}")
    return delivery


def deliveries_due_send(*, now: datetime | None = None, late: float = 60.0) -> int:
    """Queue every pending delivery past its time by `late` seconds: what a
    refused broker or a lost task left behind."""
    now = now or timezone.now()
    due = list(
        Delivery.objects.filter(
            status=DeliveryStatus.PENDING, next_attempt_at__lte=now - timedelta(seconds=late)
        ).values_list("pk", flat=True)[:5000]
    )
    for pk in due:
        task_send(DELIVER_TASK, pk, what=f"delivery {pk} (sweep)")
    return len(due)
