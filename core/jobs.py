"""Reads of how background jobs ran: each job's latest outcome (JobStatus,
written by core/signals.py) and the database scheduler's beat entries,
which operators may retime or pause."""

from __future__ import annotations

from django.db.models import QuerySet
from django_celery_beat.models import PeriodicTask

from core.models import JobStatus


def job_status_list(*, tasks: set[str]) -> QuerySet[JobStatus]:
    """The latest outcome of each (task, beat entry) of `tasks`."""
    return JobStatus.objects.filter(task__in=tasks)


def job_status_list_except(*, ids: set[int]) -> QuerySet[JobStatus]:
    """Every other (task, entry)'s latest outcome: jobs sent by hand or by
    a schedule no longer declared; by task and entry."""
    return JobStatus.objects.exclude(pk__in=ids).order_by("task", "entry")


def beat_entry_list(*, names: list[str]) -> QuerySet[PeriodicTask]:
    """The database scheduler's rows of the beat entries named."""
    return PeriodicTask.objects.filter(name__in=names)
