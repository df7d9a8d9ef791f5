"""Deliveries through a real Celery worker, as in production: the event is
queued by name when the invoice commits, the worker POSTs it, and each
failure schedules the next try with the backoff. A receiver that answers
500 twice then 200 sees the same event id three times (and must dedupe on
it); once it has said 200 nothing more is sent, however long we wait."""

from __future__ import annotations

import hashlib
import itertools
import time
from datetime import UTC, datetime

import pytest
from standardwebhooks.webhooks import Webhook

from tenants.choices import Role
from tests.billing.conftest import make_world
from tests.celery_worker import Worker, broker_at, worker_wait
from tests.factories import make_member
from tests.webhooks.helpers import endpoint_registered, invoice_finalized
from tests.webhooks.receiver import receiver_running
from webhooks.models import Delivery
from webhooks.services import deliveries_due_send

RETRY = 0.5  # seconds between tries, for the worker (WEBHOOKS_RETRY_SECONDS)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_500_twice_then_200_is_the_same_event_three_times_then_nothing(api, tmp_path):
    world = make_world()
    world.price(since=datetime(2026, 1, 1, tzinfo=UTC))
    owner = make_member(world.a, Role.OWNER).user
    worker = Worker(
        "filesystem",
        tmp_path,
        queues=("celery", "webhooks"),
        env={"WEBHOOKS_RETRY_SECONDS": f"{RETRY},{RETRY},{RETRY}"},
    ).start()
    try:
        with receiver_running(500, 500, 200) as receiver:
            endpoint = endpoint_registered(api, owner, receiver.url, "invoice.finalized")
            with broker_at(worker.url, worker.options):
                invoice_finalized(world, world.a)  # commits: the delivery is queued by name
            worker_wait(lambda: len(receiver.received) >= 3, worker, timeout=90)
            time.sleep(4 * RETRY)  # past every retry the schedule still has
            assert deliveries_due_send(late=0) == 0  # nothing pending for the sweep either
            received = list(receiver.received)
    finally:
        worker.stop()

    delivery = Delivery.objects.get()
    assert len(received) == 3
    assert [r.headers["webhook-id"] for r in received] == [delivery.event_id] * 3
    for got in received:
        assert Webhook(endpoint["secret"]).verify(got.body, got.headers)["id"] == delivery.event_id
    assert {r.body for r in received} == {received[0].body}  # byte for byte the same payload
    assert (delivery.status, delivery.attempts) == ("succeeded", 3)
    log = list(delivery.log.order_by("at", "pk"))
    assert [a.status_code for a in log] == [500, 500, 200]
    assert {a.body_sha256 for a in log} == {hashlib.sha256(received[0].body).hexdigest()}
    gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(log)]
    assert all(gap >= RETRY for gap in gaps), gaps  # each retry waited its turn
