"""A Celery worker killed (SIGKILL) in the middle of an invoice run: the
tenants it was building are untouched (one transaction each chunk), the
run is marked failed as abandoned once its worker's database session is
gone (never while the worker lives, however long it waits), and the run
done again bills each tenant once."""

from __future__ import annotations

import os
import signal
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from billing.invoicing.runs import invoice_run_create
from billing.models import Invoice, InvoiceRun
from billing.runs import ABANDONED
from billing.tasks import invoice_run_task, runs_abandoned_task
from tests.billing.conftest import NOV, OCT, make_world
from tests.celery_worker import Worker, worker_wait
from tests.services import database_session

AS_OF = datetime(2026, 11, 2, tzinfo=UTC)


def _waiting_on_a_row_lock() -> bool:
    """Some session (the worker's) waits for a lock another holds."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return cursor.fetchone()[0] > 0


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_run_is_abandoned_and_the_rerun_bills_each_tenant_once(tmp_path):
    world = make_world()
    world.price()
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=OCT + timedelta(hours=2), completion=1_000_000)

    # Hold tenant b's row, as an invoice of b being edited would: the run
    # blocks on it, mid-run, with its state "running".
    locker = database_session()
    locker.execute("SELECT 1 FROM tenants_tenant WHERE id = %s FOR UPDATE", [world.b.pk])
    worker = Worker("filesystem", tmp_path).start()
    try:
        run = invoice_run_create(as_of=AS_OF, finalize=False)
        worker.send(invoice_run_task, run.pk)
        worker_wait(_waiting_on_a_row_lock, worker)
        assert InvoiceRun.objects.get(pk=run.pk).status == "running"
        # Alive and waiting is not abandoned, however long it waits.
        assert runs_abandoned_task() == 0
        assert InvoiceRun.objects.get(pk=run.pk).status == "running"

        os.kill(worker.process.pid, signal.SIGKILL)
        worker.process.wait(timeout=30)
    finally:
        locker.rollback()
        locker.close()
        worker.stop()

    # Nothing of the chunk it was building was written.
    assert not Invoice.objects.exists()
    # Its session ends once the server notices the client is gone (right
    # after the lock is granted); then the sweep marks the run failed.
    marked: list[int] = []
    worker_wait(lambda: marked.append(runs_abandoned_task()) or sum(marked) == 1, timeout=30)
    abandoned = InvoiceRun.objects.get(pk=run.pk)
    assert (abandoned.status, abandoned.failures) == (
        "failed",
        [{"tenant": "", "error": ABANDONED}],
    )
    assert abandoned.finished_at is not None

    # The operator runs it again: one draft per tenant, the run done.
    rerun = invoice_run_create(as_of=AS_OF, finalize=False)
    worker = Worker("filesystem", tmp_path).start()
    try:
        worker.send(invoice_run_task, rerun.pk)
        worker_wait(lambda: InvoiceRun.objects.get(pk=rerun.pk).status == "done", worker)
    finally:
        worker.stop()
    drafts = Invoice.objects.filter(period_start=OCT, period_end=NOV)
    assert sorted(drafts.values_list("tenant_id", "status", "run_id")) == sorted(
        [(world.a.pk, "draft", rerun.pk), (world.b.pk, "draft", rerun.pk)]
    )
    assert InvoiceRun.objects.get(pk=rerun.pk).invoices_created == 2
