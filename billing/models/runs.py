"""What every background run of billing shares (an allocation run, an
invoice run, a margin report): a status a person watches move from queued
to running to done or failed, who asked for it, when it was asked for and
when it finished. The transitions are billing.runs."""

from __future__ import annotations

from django.conf import settings
from django.db import models

from billing.choices import RunStatus


class RunLifecycle(models.Model):
    """A run's lifecycle columns (abstract: each run keeps its own table,
    progress counters and constraints)."""

    status = models.CharField(max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED)
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        abstract = True

    @classmethod
    def failed_because(cls, reason: str) -> dict[str, object]:
        """The columns that say why a run failed, for `reason` (the run's
        page shows them)."""
        return {"error": reason}
