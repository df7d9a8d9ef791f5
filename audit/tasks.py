"""The audit trail's scheduled job: its retention (audit.retention)."""

from celery import shared_task
from django.utils import timezone

from audit.retention import audit_archive


@shared_task(name="audit.archive", time_limit=3600, soft_time_limit=3300, ignore_result=True)
def audit_archive_task() -> int:
    """Archive and remove the audit entries past the retention horizon."""
    return len(audit_archive(now=timezone.now()))
