"""A real Celery worker process runs a real task whose result lands in the
database: on Redis (the machine's) and on the serverless folder broker."""

import time
from datetime import UTC, datetime

import pytest

from billing.choices import RunStatus
from billing.models import InvoiceRun
from billing.runs import ABANDONED
from billing.tasks import runs_abandoned_task
from tests.celery_worker import Worker


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["redis", "filesystem"])
def test_worker_runs_task_and_writes_the_database(kind, tmp_path):
    # A run left "running" by a worker that is gone (no session holds its
    # lock) and one that finished: the sweep fails the first only.
    dead = InvoiceRun.objects.create(as_of=datetime(2026, 11, 1, tzinfo=UTC), status="running")
    done = InvoiceRun.objects.create(as_of=datetime(2026, 10, 1, tzinfo=UTC), status="done")

    worker = Worker(kind, tmp_path).start()
    try:
        worker.send(runs_abandoned_task)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if InvoiceRun.objects.get(pk=dead.pk).status != RunStatus.RUNNING:
                break
            assert worker.alive(), worker.output()
            time.sleep(0.3)
        dead.refresh_from_db()
        assert dead.status == RunStatus.FAILED, worker.output()
        assert dead.failures == [{"tenant": "", "error": ABANDONED}]
        assert InvoiceRun.objects.get(pk=done.pk).status == RunStatus.DONE
        assert "billing.runs_abandoned" in worker.output()
    finally:
        worker.stop()
