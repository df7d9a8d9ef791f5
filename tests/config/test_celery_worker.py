"""A real Celery worker process runs a real task whose result lands in the
database: on Redis (the machine's) and on the serverless folder broker."""

import time

import pytest
from django.utils import timezone

from tenants.models import ApiKey
from tenants.tasks import api_keys_mark_used_task
from tests.celery_worker import Worker
from tests.factories import make_key, make_tenant


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["redis", "filesystem"])
def test_worker_runs_task_and_writes_the_database(kind, tmp_path):
    tenant = make_tenant()
    key, _ = make_key(tenant)
    other, _ = make_key(make_tenant())
    used_at = timezone.now().replace(microsecond=0)

    worker = Worker(kind, tmp_path).start()
    try:
        worker.send(api_keys_mark_used_task, {str(key.pk): used_at.isoformat()})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if ApiKey.objects.get(pk=key.pk).last_used_at is not None:
                break
            assert worker.alive(), worker.output()
            time.sleep(0.3)
        assert ApiKey.objects.get(pk=key.pk).last_used_at == used_at, worker.output()
        assert ApiKey.objects.get(pk=other.pk).last_used_at is None
        assert "tenants.api_keys_mark_used" in worker.output()
    finally:
        worker.stop()
