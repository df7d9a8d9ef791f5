"""What core stores: the latest outcome of each background job."""

from django.db import models


class JobStatus(models.Model):
    """How one job last ended: a Celery task, and the beat entry that sent
    it when known ("" for a task queued by hand or by celery's own beat
    scheduler). One row per (task, entry), written by the worker's task
    signals (core/signals.py); history lives in the logs, not here."""

    task = models.CharField(max_length=200)
    entry = models.CharField(max_length=200, blank=True, default="")
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_failure_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "job statuses"
        constraints = [
            models.UniqueConstraint(fields=["task", "entry"], name="core_jobstatus_task_entry")
        ]

    def __str__(self) -> str:
        return f"{self.entry or self.task}"
