"""Celery task signals -> JobStatus: when a task starts, succeeds or fails
in a worker, its row (task name, beat entry name when beat sent it) is
upserted. Recording never fails the task: a database error is logged."""

from __future__ import annotations

import logging

from celery.signals import task_failure, task_prerun, task_success
from django.dispatch import Signal
from django.utils import timezone

from core.models import JobStatus

logger = logging.getLogger(__name__)
ERROR_CHARS = 2000


def job_status_record(*, task: str, entry: str = "", **fields) -> None:
    """Insert or update the (task, entry) row with `fields`, in one
    statement (two workers finishing at once do not clash)."""
    row = JobStatus(task=task, entry=entry, **fields)
    JobStatus.objects.bulk_create(
        [row],
        update_conflicts=True,
        unique_fields=["task", "entry"],
        update_fields=[*fields, "updated_at"],
    )


def _record(task, **fields) -> None:
    name = getattr(task, "name", None) or ""
    if not name or name.startswith("celery."):
        return
    # django-celery-beat puts its entry's name in this message header.
    entry = getattr(task.request, "periodic_task_name", None) or ""
    try:
        job_status_record(task=name, entry=entry, **fields)
    except Exception:
        logger.exception("could not record the outcome of %s (%s)", name, entry or "no entry")


@task_prerun.connect(dispatch_uid="core.job_started")
def _job_started(sender=None, task=None, **kwargs) -> None:
    _record(task or sender, last_started_at=timezone.now())


@task_success.connect(dispatch_uid="core.job_succeeded")
def _job_succeeded(sender=None, **kwargs) -> None:
    _record(sender, last_success_at=timezone.now())


# Sent after a job's failure is recorded, with task (its name), task_id and
# error: higher apps act on it (webhooks' job.failed) without core knowing them.
job_failed = Signal()


@task_failure.connect(dispatch_uid="core.job_failed")
def _job_failed(sender=None, exception=None, task_id=None, **kwargs) -> None:
    error = f"{type(exception).__name__}: {exception}"[:ERROR_CHARS]
    _record(sender, last_failure_at=timezone.now(), last_error=error)
    name = getattr(sender, "name", None) or ""
    if name and not name.startswith("celery."):
        try:
            job_failed.send(sender=None, task=name, task_id=task_id or "", error=error)
        except Exception:
            logger.exception("could not tell of the failure of %s", name)
