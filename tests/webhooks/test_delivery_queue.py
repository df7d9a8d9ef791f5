"""Deliveries have workers of their own (issue 60, finding 3): with real
Celery workers as deployed (one on the default queue, one on
settings.WEBHOOKS_QUEUE), a tenant whose ten endpoints (the most it may
hold) trickle their answers holds the deliveries' worker for minutes,
and an invoice run and a metering run sent meanwhile finish in seconds
on the other. On one queue they would wait behind every trickle."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from django.conf import settings
from django.utils import timezone

from config.celery_app import app
from core.models import JobStatus
from tests.billing.conftest import make_world
from tests.celery_worker import Worker, broker_at, worker_wait
from tests.webhooks.helpers import invoice_finalized
from tests.webhooks.test_hostile_endpoints import _gigabyte, _server, _trickle
from webhooks.models import Delivery, DeliveryAttempt
from webhooks.services import endpoint_create

DEADLINE = 20  # seconds an attempt may take (WEBHOOKS_ATTEMPT_DEADLINE_SECONDS)
JOBS = ("billing.invoice_daily", "metering.run")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_jobs_finish_on_time_while_hostile_endpoints_hold_the_delivery_worker(tmp_path):
    world = make_world()
    world.price(since=datetime(2026, 1, 1, tzinfo=UTC))
    trickle, trickle_stop = _server(_trickle)
    gigabyte, gigabyte_stop = _server(_gigabyte)
    endpoint_create(
        tenant=world.b, url=f"http://127.0.0.1:{gigabyte}/hook", event_types=["invoice.finalized"]
    )
    for n in range(settings.WEBHOOKS["MAX_ENDPOINTS"]):
        endpoint_create(
            tenant=world.a,
            url=f"http://127.0.0.1:{trickle}/hook{n}",
            event_types=["invoice.finalized"],
        )
    billing = Worker("filesystem", tmp_path, queues=("celery",)).start()
    deliveries = Worker(
        "filesystem",
        tmp_path,
        queues=(settings.WEBHOOKS_QUEUE,),
        env={"WEBHOOKS_ATTEMPT_DEADLINE_SECONDS": str(DEADLINE)},
    ).start()
    try:
        with broker_at(billing.url, billing.options):
            invoice_finalized(world, world.b)  # the gigabyte first: it reads 64 KiB and ends
            invoice_finalized(world, world.a)  # then ten trickles of DEADLINE seconds each
            worker_wait(lambda: DeliveryAttempt.objects.exists(), deliveries, timeout=60)
            sent = timezone.now()
            began = time.monotonic()
            for job in JOBS:
                app.send_task(job)

            def finished() -> bool:
                done = JobStatus.objects.filter(task__in=JOBS, last_success_at__gte=sent)
                return done.count() == len(JOBS)

            worker_wait(finished, billing, timeout=90)
            took = time.monotonic() - began
            trickled = DeliveryAttempt.objects.filter(delivery__endpoint__tenant=world.a).count()
    finally:
        billing.stop()
        deliveries.stop()
        trickle_stop.set()
        gigabyte_stop.set()

    # On one queue the jobs would have waited for ten trickles (200 s).
    assert took < 2 * DEADLINE, (took, billing.output()[-3000:])
    assert trickled < settings.WEBHOOKS["MAX_ENDPOINTS"], trickled  # still at them meanwhile
    read = Delivery.objects.get(endpoint__tenant=world.b).log.get()
    assert read.status_code == 200 and len(read.response_excerpt) <= 500
    assert "billing.invoice_daily[" not in deliveries.output()  # "Task NAME[id] received"
    assert "webhooks.deliver[" not in billing.output()
