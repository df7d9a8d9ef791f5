"""Webhook deliveries as Celery tasks: one attempt each (the service
schedules the next), and a sweep for what was never queued."""

from celery import shared_task

from webhooks.services import deliveries_due_send, delivery_attempt


@shared_task(name="webhooks.deliver", time_limit=1200, soft_time_limit=1100, ignore_result=True)
def deliver_task(delivery_ids: int | list[int]) -> None:
    """One attempt of each delivery named, if it is due (safe to run twice)."""
    for delivery_id in [delivery_ids] if isinstance(delivery_ids, int) else delivery_ids:
        delivery_attempt(delivery_id=delivery_id)


@shared_task(
    name="webhooks.deliveries_due", time_limit=300, soft_time_limit=270, ignore_result=True
)
def deliveries_due_task() -> int:
    """Every minute: deliveries past their time, queued again."""
    return deliveries_due_send()
