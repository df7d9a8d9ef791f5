"""A tenant's endpoint cannot tie up the delivery workers (issue 60,
finding 3), attacked with real servers on loopback: one that trickles its
answer a byte at a time (each read well inside the per-read timeout) and
one that answers a gigabyte. Each attempt ends within its deadline, reads
at most 64 KiB, and holds no lock on the delivery meanwhile (another
transaction takes it at once); a tenant holds at most 10 endpoints."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
from django.db import connections, transaction

from tests.webhooks.helpers import endpoint_post
from webhooks.choices import EventType
from webhooks.models import Delivery, Endpoint
from webhooks.services import delivery_attempt, endpoint_create, event_emit

pytestmark = pytest.mark.django_db(transaction=True)


def _server(answer) -> tuple[int, threading.Event]:
    """A loopback server running `answer(conn)` for each connection."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)

    def serve():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.recv(65536)
                with contextlib.suppress(OSError):  # the client went: done
                    answer(conn, stop)
        listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], stop


def _trickle(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    while not stop.is_set():
        conn.sendall(b"x")
        time.sleep(0.5)


def _gigabyte(conn, stop):
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % 1024**3)
    block = b"0" * 65536
    for _ in range(1024**3 // len(block)):
        if stop.is_set():
            return
        conn.sendall(block)


def _delivery(world_a, port: int) -> Delivery:
    endpoint = endpoint_create(
        tenant=world_a.tenant, url=f"http://127.0.0.1:{port}/hook", event_types=["invoice.paid"]
    )
    event_emit(
        type=EventType.INVOICE_PAID, tenant=world_a.tenant, key=f"k{port}", summary="s", data={}
    )
    return Delivery.objects.get(endpoint=endpoint)


def test_a_trickling_endpoint_ends_at_the_deadline_holding_no_lock(world_a, settings):
    settings.WEBHOOKS = {**settings.WEBHOOKS, "TIMEOUT_SECONDS": 5, "ATTEMPT_DEADLINE_SECONDS": 3}
    port, stop = _server(_trickle)
    delivery = _delivery(world_a, port)
    done: dict = {}

    def attempt():
        began = time.monotonic()
        done["attempt"] = delivery_attempt(delivery_id=delivery.pk)
        done["took"] = time.monotonic() - began
        connections.close_all()

    worker = threading.Thread(target=attempt)
    worker.start()
    time.sleep(1.5)  # mid-attempt: the delivery's row is free to take
    with transaction.atomic():
        taken = Delivery.objects.select_for_update(nowait=True).get(pk=delivery.pk)
    worker.join(timeout=30)
    stop.set()
    assert taken.pk == delivery.pk
    assert done["took"] < 4.5, done["took"]  # a byte every 0.5 s would have gone on for minutes
    assert done["attempt"].status_code is None
    assert "within the attempt's 3 s" in done["attempt"].error


def test_a_gigabyte_answer_is_read_no_further_than_64_kib(world_a):
    port, stop = _server(_gigabyte)
    delivery = _delivery(world_a, port)
    began = time.monotonic()
    attempt = delivery_attempt(delivery_id=delivery.pk)
    took = time.monotonic() - began
    stop.set()
    assert attempt.status_code == 200 and len(attempt.response_excerpt) <= 500
    assert took < 5, took


def test_a_tenant_holds_at_most_ten_endpoints(api, world_a):
    for n in range(10):
        endpoint_create(
            tenant=world_a.tenant, url=f"http://127.0.0.1:9/{n}", event_types=["invoice.paid"]
        )
    refused = endpoint_post(api, world_a.owner.user, "http://127.0.0.1:9/11", ["invoice.paid"])
    assert refused.status_code == 400
    assert "at most 10 endpoints" in refused.json()["error"]["message"]
    assert Endpoint.objects.filter(tenant=world_a.tenant).count() == 10
