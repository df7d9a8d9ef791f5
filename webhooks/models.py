"""Endpoints, events, deliveries and their attempts, and email alert opt-outs."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q

from tenants.models import Tenant
from webhooks.choices import DeliveryStatus, EventType


class Endpoint(models.Model):
    """A URL that receives the events it chose, signed with its own secret.
    A tenant's hears its tenant's events; the operator's (no tenant) hears
    every tenant's and the operator-only ones."""

    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=500)
    description = models.CharField(max_length=200, blank=True, default="")
    event_types = ArrayField(models.CharField(max_length=40, choices=EventType.choices))
    # whsec_ and base64: the receiver verifies signatures with it.
    secret = models.CharField(max_length=100, editable=False)
    active = models.BooleanField(default=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]
        constraints = [
            models.CheckConstraint(
                condition=Q(event_types__len__gt=0) & Q(event_types__contained_by=EventType.values),
                name="endpoint_event_types_known",
            ),
        ]

    def __str__(self) -> str:
        return self.url


class Event(models.Model):
    """Something that happened, once. Its id (webhook-id) is the
    idempotency key receivers dedupe on; `key` makes emitting it twice (a
    job run again) a no-op."""

    id = models.CharField(max_length=40, primary_key=True)
    type = models.CharField(max_length=40, choices=EventType.choices)
    tenant = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.CASCADE, related_name="events"
    )
    key = models.CharField(max_length=200, unique=True)
    summary = models.CharField(max_length=300)
    detail = models.TextField(blank=True, default="")
    data = models.JSONField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="event_tenant_recent")]

    def __str__(self) -> str:
        return f"{self.id} {self.type}"


class Delivery(models.Model):
    """One event to one endpoint: tried until it answers 2xx, or the
    retries run out."""

    event = models.ForeignKey(Event, on_delete=models.CASCADE, related_name="deliveries")
    endpoint = models.ForeignKey(Endpoint, on_delete=models.CASCADE, related_name="deliveries")
    status = models.CharField(
        max_length=12, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    # Who asked for the next attempt by hand (a redelivery), for its log line.
    requested_by = models.CharField(max_length=150, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        constraints = [
            models.UniqueConstraint(fields=["event", "endpoint"], name="delivery_once_per_endpoint")
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending"),
                name="delivery_due",
            )
        ]

    def __str__(self) -> str:
        return f"{self.event_id} -> {self.endpoint_id} ({self.status})"


class DeliveryAttempt(models.Model):
    """One POST of a delivery: what came back and how long it took."""

    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="log")
    at = models.DateTimeField()
    status_code = models.PositiveIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField()
    error = models.CharField(max_length=300, blank=True, default="")
    body_sha256 = models.CharField(max_length=64)
    response_excerpt = models.CharField(max_length=500, blank=True, default="")
    by = models.CharField(max_length=150, blank=True, default="")  # a redelivery's asker

    class Meta:
        ordering = ["-at", "-pk"]

    def __str__(self) -> str:
        return (
            f"{self.delivery_id} at {self.at:%Y-%m-%d %H:%M:%S}: {self.status_code or self.error}"
        )


class AlertOptOut(models.Model):
    """A member who asked not to be emailed about one kind of event of
    one tenant (alerts are on unless opted out)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=40, choices=EventType.choices)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["user", "tenant", "event_type"], name="alert_opt_out_once"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} not emailed of {self.event_type} at {self.tenant}"
