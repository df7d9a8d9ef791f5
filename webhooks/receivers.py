"""Events heard from below: a Celery job's failure (core.signals)."""

from django.dispatch import receiver

from core.signals import job_failed
from webhooks.choices import EventType
from webhooks.services import event_emit


@receiver(job_failed, dispatch_uid="webhooks.job_failed")
def _job_failed(sender, *, task: str, task_id: str, error: str, **kwargs) -> None:
    if task.startswith("webhooks."):
        return  # a delivery's own failure would emit another delivery
    event_emit(
        type=EventType.JOB_FAILED,
        tenant=None,
        key=f"job.failed:{task_id}",
        summary=f"job {task} failed: {error}"[:300],
        data={"task": task, "task_id": task_id, "error": error},
    )
