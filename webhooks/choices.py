"""The events there are, who may hear each, and a delivery's states."""

from django.db import models


class EventType(models.TextChoices):
    INVOICE_FINALIZED = "invoice.finalized", "An invoice was finalized"
    INVOICE_PAID = "invoice.paid", "An invoice was paid"
    INVOICE_PAYMENT_FAILED = "invoice.payment_failed", "A payment of an invoice failed"
    BUDGET_THRESHOLD_CROSSED = "budget.threshold_crossed", "A monthly budget threshold was crossed"
    CREDIT_LOW = "credit.low", "Prepaid credit is running low"
    SLO_BREACHED = "slo.breached", "A service level was missed over a day"
    REPLICA_DOWN = "replica.down", "A replica went down (operator only)"
    JOB_FAILED = "job.failed", "A background job failed (operator only)"


# What a tenant's endpoints and alerts may choose; the operator's hear all.
TENANT_EVENTS = (
    EventType.INVOICE_FINALIZED,
    EventType.INVOICE_PAID,
    EventType.INVOICE_PAYMENT_FAILED,
    EventType.BUDGET_THRESHOLD_CROSSED,
    EventType.CREDIT_LOW,
    EventType.SLO_BREACHED,
)


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"  # to be tried (again) at next_attempt_at
    SUCCEEDED = "succeeded", "Delivered"
    FAILED = "failed", "Failed: retries used up"
