"""Webhook deliveries as Celery tasks: one attempt each (the service
schedules the next), and a sweep for what was never queued."""

from celery import shared_task

from webhooks.services import deliveries_due_send, delivery_attempt


@shared_task(name="webhooks.deliver", time_limit=120, soft_time_limit=100, ignore_result=True)
def deliver_task(delivery_id: int) -> None:
    """One attempt of a delivery, if it is due (safe to run twice)."""
    delivery_attempt(delivery_id=delivery_id)


@shared_task(
    name="webhooks.deliveries_due", time_limit=300, soft_time_limit=270, ignore_result=True
)
def deliveries_due_task() -> int:
    """Every minute: deliveries past their time, queued again."""
    return deliveries_due_send()
