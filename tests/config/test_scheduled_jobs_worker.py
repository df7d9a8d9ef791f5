"""Every beat-scheduled job, sent the way beat sends it (django-celery-beat's
database scheduler, synced from config/schedule.py, through celery.beat's
apply_async) over Redis, is run to success by a real worker; finance then
sees each success on the jobs page and Prometheus in /metrics."""

from __future__ import annotations

import time

import pytest
from django.utils import timezone
from django_celery_beat.models import PeriodicTask
from django_celery_beat.schedulers import DatabaseScheduler, ModelEntry
from kombu import Connection

from billing.choices import RunStatus
from billing.models import MarginReport
from config.celery_app import app
from config.schedule import BEAT_SCHEDULE
from core.models import JobStatus
from tests.celery_worker import Worker
from tests.dashboard.test_jobs_page import _rows, gauges
from tests.factories import make_finance_user, make_tenant

TIMEOUT = 90


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_beat_sends_every_scheduled_job_and_a_worker_runs_each_to_success(tmp_path, client):
    make_tenant(name="Alpha")
    make_tenant(name="Bravo", billing_currency="EUR")
    worker = Worker("redis", tmp_path).start()
    started = timezone.now()
    try:
        # What beat does at start: the declared schedule into the database.
        DatabaseScheduler(app=app, lazy=True).setup_schedule()
        # Routed to this test's worker, as an operator would in the admin.
        PeriodicTask.objects.filter(name__in=list(BEAT_SCHEDULE)).update(queue=worker.queue)
        scheduler = DatabaseScheduler(app=app, lazy=True)
        with Connection(worker.url, transport_options=worker.options) as conn:
            producer = app.amqp.Producer(conn, auto_declare=False)
            for name in BEAT_SCHEDULE:
                entry = ModelEntry(PeriodicTask.objects.get(name=name), app=app)
                scheduler.apply_async(entry, producer=producer)

        def outcomes():
            return {
                s.entry: s
                for s in JobStatus.objects.filter(entry__in=list(BEAT_SCHEDULE))
                if s.last_success_at or s.last_failure_at
            }

        deadline = time.monotonic() + TIMEOUT
        while len(outcomes()) < len(BEAT_SCHEDULE):
            assert worker.alive(), worker.output()
            assert time.monotonic() < deadline, (
                set(BEAT_SCHEDULE) - set(outcomes()),
                worker.output(),
            )
            time.sleep(0.2)
    finally:
        worker.stop()

    failed = {name: s.last_error for name, s in outcomes().items() if s.last_failure_at}
    assert failed == {}, worker.output()
    for name, status in outcomes().items():
        assert status.task == BEAT_SCHEDULE[name]["task"]
        assert status.last_success_at >= started
    # The margin reports the schedule asks for were built, not just attempted.
    built = dict(MarginReport.objects.values_list("kind", "status"))
    assert built == {"flash": RunStatus.DONE, "mtd": RunStatus.DONE, "close": RunStatus.DONE}

    client.force_login(make_finance_user())
    rows = _rows(client)
    for name in BEAT_SCHEDULE:
        assert "never" not in rows[name], rows[name]
    assert 'class="stale"' not in client.get("/jobs/").content.decode()
    success = gauges(client, "gpu_ledger_job_last_success_timestamp_seconds")
    assert all(success[name] >= started.timestamp() for name in BEAT_SCHEDULE), success
