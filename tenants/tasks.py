"""Celery tasks for tenants: thin, idempotent, taking ids."""

from celery import shared_task
from django.utils.dateparse import parse_datetime

from tenants.services import api_keys_mark_used


@shared_task(
    name="tenants.api_keys_mark_used", time_limit=60, soft_time_limit=50, ignore_result=True
)
def api_keys_mark_used_task(used_at_by_key: dict[str, str]) -> int:
    """Record keys' last use, batched by the caller. Safe to run twice: a
    timestamp only ever moves forward."""
    return api_keys_mark_used(
        used_at_by_key={int(key_id): parse_datetime(at) for key_id, at in used_at_by_key.items()}
    )
