"""POST /api/v1/usage/events survives faults, caused for real: the web app
is a uvicorn process, its database a PostgreSQL of the test's own
(tests/own_postgres.py), stopped with pg_ctl, or a table lock another
session holds so that the batch's transaction waits while the client gives
up. A batch is committed whole or refused, and a retry counts nothing twice."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import django.db
import httpx
import psycopg
import psycopg_pool
import pytest
from django.db import connection
from django.db.models import Count, Sum

from core.api_errors import api_exception_handler
from core.processes import ManagedProcess, uvicorn_argv
from metering.models import UsageEvent, UsageKey
from tenants.services import service_key_create
from tests.ledger import Ledger
from tests.metering.test_ingest_api import URL, as_json
from tests.services import free_port

BATCH = 6
POOL_WAIT = 5  # seconds: the web app's wait for a pooled connection (as deployed)


def batch(ledger: Ledger, prefix: str) -> list[dict]:
    """Six events, half of each tenant's, each with tokens of its own: a
    sum tells one row missing or counted twice."""
    events = []
    for n in range(BATCH):
        tenant = ledger.a if n % 2 == 0 else ledger.b
        event = ledger.event(
            f"{prefix}-{n}", tenant=tenant, prompt_tokens=100 + n, completion_tokens=10 + n
        )
        events.append(as_json(event))
    return events


def expected(events: list[dict], *, tenant_id: int) -> tuple[int, int, int]:
    """(rows, prompt tokens, completion tokens) of a tenant's events."""
    mine = [e for e in events if e["tenant_id"] == tenant_id]
    return (
        len(mine),
        sum(e["prompt_tokens"] for e in mine),
        sum(e["completion_tokens"] for e in mine),
    )


def recorded(events: list[dict], *, tenant_id: int) -> tuple[int, int, int]:
    """What the ledger holds of `events` for a tenant, as `expected` counts."""
    totals = UsageEvent.objects.filter(
        request_id__in=[e["request_id"] for e in events], tenant_id=tenant_id
    ).aggregate(rows=Count("pk"), prompt=Sum("prompt_tokens"), completion=Sum("completion_tokens"))
    return totals["rows"], totals["prompt"] or 0, totals["completion"] or 0


def keys_recorded(events: list[dict]) -> int:
    return UsageKey.objects.filter(request_id__in=[e["request_id"] for e in events]).count()


def assert_recorded_once(ledger: Ledger, events: list[dict]) -> None:
    for tenant in (ledger.a, ledger.b):
        assert recorded(events, tenant_id=tenant.pk) == expected(events, tenant_id=tenant.pk)
    assert keys_recorded(events) == len(events)


def assert_nothing_recorded(ledger: Ledger, events: list[dict]) -> None:
    for tenant in (ledger.a, ledger.b):
        assert recorded(events, tenant_id=tenant.pk) == (0, 0, 0)
    assert keys_recorded(events) == 0


@contextmanager
def web_app(*, database_url: str, secret: str, log_dir) -> Iterator[httpx.Client]:
    """The web app as uvicorn runs it, on the given database; a client
    reporting with the service key `secret`."""
    port = free_port()
    web = ManagedProcess(
        name="web-faults",
        argv=uvicorn_argv("config.asgi:application", host="127.0.0.1", port=port),
        env={"DATABASE_URL": database_url, "DATABASE_POOL_TIMEOUT": str(POOL_WAIT)},
        log_path=log_dir / "web.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    web.start()
    try:
        web.wait_ready(timeout=60)
        with httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {secret}"},
            timeout=60,
        ) as client:
            yield client
    finally:
        web.stop()


def statuses(answer: httpx.Response) -> list[str]:
    return [r["status"] for r in answer.json()["results"]]


def test_a_batch_sent_while_the_database_is_stopped_is_a_503_and_its_retry_is_recorded_whole(
    own_postgres, ledger, tmp_path
):
    _key, secret = service_key_create(name="edge fleet")
    events = batch(ledger, "outage")
    with web_app(database_url=own_postgres.url, secret=secret, log_dir=tmp_path) as client:
        # The web app's pooled connection is open when the server goes.
        first = client.post(URL, json={"events": [as_json(ledger.event("before"))]})
        assert first.status_code == 200, first.text

        own_postgres.stop()
        try:
            began = time.monotonic()
            refused = client.post(URL, json={"events": events})
            took = time.monotonic() - began
        finally:
            own_postgres.start()
        connection.close()  # the test's own connection went with the server

        assert refused.status_code == 503, refused.text
        assert refused.headers["content-type"] == "application/json"
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["code"] == "database_unavailable"
        assert "database" in error["message"]
        # A request waits for a pooled connection up to the pool's timeout
        # (DATABASE_POOL_TIMEOUT) before it is told; never longer.
        assert took < POOL_WAIT + 10, f"the 503 took {took:.1f}s"
        assert_nothing_recorded(ledger, events)

        # The client does as Retry-After says until the web app has its
        # database again; every answer before is a 503 that wrote nothing.
        again = post_until_answered(client, events)
        assert again.status_code == 200, again.text
        assert again.json()["accepted"] == BATCH
        assert again.json()["duplicates"] == 0
        assert statuses(again) == ["accepted"] * BATCH

    assert_recorded_once(ledger, events)
    assert UsageEvent.objects.count() == BATCH + 1  # and the one before the outage


def test_a_batch_whose_client_timed_out_is_committed_once_and_its_retry_is_all_duplicates(
    own_postgres, ledger, tmp_path
):
    _key, secret = service_key_create(name="edge fleet")
    events = batch(ledger, "slow")
    with web_app(database_url=own_postgres.url, secret=secret, log_dir=tmp_path) as client:
        # Another session holds the dirty hours, which a batch marks last,
        # just before its commit: the batch's transaction waits for it.
        holder = psycopg.connect(own_postgres.url)
        try:
            holder.execute("LOCK TABLE metering_dirtyhour IN EXCLUSIVE MODE")
            try:
                client.post(URL, json={"events": events}, timeout=1.0)
            except httpx.ReadTimeout:
                pass
            else:
                raise AssertionError("the POST answered while its commit was held")
            waiting = batch_waiting_on_lock(table="metering_dirtyhour")
            assert waiting, "no session of the web app waits on the lock"
            assert_nothing_recorded(ledger, events)  # not committed yet
        finally:
            holder.rollback()  # the lock goes, the batch commits
            holder.close()

        deadline = time.monotonic() + 15
        while keys_recorded(events) < BATCH and time.monotonic() < deadline:
            time.sleep(0.1)
        assert_recorded_once(ledger, events)

        retry = client.post(URL, json={"events": events})
        assert retry.status_code == 200, retry.text
        assert retry.json()["accepted"] == 0
        assert retry.json()["duplicates"] == BATCH
        assert statuses(retry) == ["duplicate"] * BATCH

    assert_recorded_once(ledger, events)
    assert UsageEvent.objects.count() == BATCH


def test_a_batch_cut_short_by_the_database_stopping_writes_nothing_and_its_retry_is_whole(
    own_postgres, ledger, tmp_path
):
    """The batch's session is cut and the server stops while its rows and
    keys are written but not committed: the client is told 503, and the same batch sent again
    is accepted whole, not a row of it a duplicate."""
    _key, secret = service_key_create(name="edge fleet")
    events = batch(ledger, "cut")
    with web_app(database_url=own_postgres.url, secret=secret, log_dir=tmp_path) as client:
        holder = psycopg.connect(own_postgres.url)
        holder.execute("LOCK TABLE metering_dirtyhour IN EXCLUSIVE MODE")
        with ThreadPoolExecutor(max_workers=1) as pool:
            # One wait for a pooled connection before the answer (the
            # rolled-back transaction's end): a batch whose database went
            # away is not tried again on the ledger's careful path.
            patience = POOL_WAIT + 10
            sent = pool.submit(client.post, URL, json={"events": events}, timeout=patience)
            try:
                assert batch_waiting_on_lock(table="metering_dirtyhour")
                # Its keys are written, in the transaction that waits.
                assert tables_written_by_waiter(waiting_on="metering_dirtyhour") >= {
                    "metering_usagekey",
                    "metering_attributionwindow",
                }
            finally:
                # The batch's session is cut first, while the lock still
                # holds it: a fast shutdown signals every session at once,
                # and the holder's ending first let the batch commit (CI
                # read a 200). Then the server stops.
                holder.execute(
                    "SELECT pg_terminate_backend(pid, 10000) FROM pg_locks"
                    " WHERE NOT granted AND relation = 'metering_dirtyhour'::regclass"
                )
                own_postgres.stop()
                holder.close()
            stopped = time.monotonic()
            cut = sent.result(timeout=patience + 5)
            took = time.monotonic() - stopped
        own_postgres.start()
        connection.close()

        assert cut.status_code == 503, cut.text
        assert cut.json()["error"]["code"] == "database_unavailable"
        assert took < patience, f"the 503 took {took:.1f}s"
        assert_nothing_recorded(ledger, events)

        again = post_until_answered(client, events)
        assert again.status_code == 200, again.text
        assert statuses(again) == ["accepted"] * BATCH

    assert_recorded_once(ledger, events)
    assert UsageEvent.objects.count() == BATCH


def post_until_answered(client: httpx.Client, events: list[dict]) -> httpx.Response:
    """POST the batch, and again after Retry-After while the answer is
    503 database_unavailable (the web app reconnecting), for up to a minute."""
    deadline = time.monotonic() + 60
    while True:
        answer = client.post(URL, json={"events": events})
        if answer.status_code != 503 or time.monotonic() > deadline:
            return answer
        assert answer.json()["error"]["code"] == "database_unavailable"
        time.sleep(int(answer.headers["retry-after"]))


def tables_written_by_waiter(*, waiting_on: str) -> set[str]:
    """The tables that the session waiting for a lock on `waiting_on` has
    written in its transaction (holds a ROW EXCLUSIVE lock on)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT held.relation::regclass::text FROM pg_locks held
            WHERE held.granted AND held.mode = 'RowExclusiveLock' AND held.pid IN (
                SELECT pid FROM pg_locks WHERE NOT granted AND relation = %s::regclass)
            """,
            [waiting_on],
        )
        return {table for (table,) in cursor.fetchall()}


def batch_waiting_on_lock(*, table: str, timeout: float = 10) -> bool:
    """Whether a session comes to wait for a lock on `table` within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass",
                [table],
            )
            if cursor.fetchone()[0]:
                return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("cause", "unavailable"),
    [
        (psycopg_pool.PoolTimeout("couldn't get a connection after 30.00 sec"), True),
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (psycopg.errors.AdminShutdown("terminating connection"), True),
        (psycopg.errors.CannotConnectNow("the database system is starting up"), True),
        (psycopg.errors.ConnectionFailure("connection failure"), True),
        (psycopg.errors.LockNotAvailable("canceling statement due to lock timeout"), False),
        (psycopg.errors.DeadlockDetected("deadlock detected"), False),
        (psycopg.errors.QueryCanceled("canceling statement due to statement timeout"), False),
    ],
)
def test_only_the_database_being_away_is_a_503(cause, unavailable):
    """A query that failed on a live server (a lock timeout, a deadlock) is
    an error of its own, not the database being unavailable."""
    exc = django.db.OperationalError(str(cause))
    exc.__cause__ = cause
    response = api_exception_handler(exc, {})
    if not unavailable:
        assert response is None  # Django's 500, logged with its traceback
        return
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.data == {
        "error": {
            "code": "database_unavailable",
            "message": "the database is unavailable: try again shortly",
            "field": None,
        }
    }
