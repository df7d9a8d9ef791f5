"""A run whose task fails, for any reason, ends failed with the error on
its page: started from the page's form, queued to the
broker, its message run as a worker runs it, with the task made to raise
at each stage: before the run's row is read into a run (the task, the
sweep before it), after its liveness lock is taken but before it is
marked running, and inside the run (run_executing). Before, an error
before the run was marked running left it "queued" for ever, and an
invoice run as of year 1 said "running 0/6" for ever."""

from __future__ import annotations

import html
from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone
from kombu import Connection

from billing import tasks
from billing.choices import RunStatus
from billing.costs import runs as allocation_runs
from billing.invoicing import runs as invoice_runs
from billing.models import AllocationRun, InvoiceRun
from billing.runs import _liveness_key
from config.celery_app import app
from tests.celery_worker import broker_at
from tests.factories import make_finance_user
from tests.services import database_session

pytestmark = pytest.mark.django_db(transaction=True)  # on_commit sends, as in production


@pytest.fixture
def broker():
    """An in-memory broker the page's sends reach, empty: the memory
    transport is one per process, and earlier tests may have left
    messages in it (a Stripe sync queued after a commit)."""
    with broker_at("memory://"):
        with Connection("memory://") as conn:
            conn.SimpleQueue(app.conf.task_default_queue).clear()
        yield


def _work() -> list:
    """What a worker does with the queued messages: each run by its task
    (Celery's own tracing, in this process, so a monkeypatch holds); the
    results, failed or not."""
    results = []
    with Connection("memory://") as conn:
        queue = conn.SimpleQueue(app.conf.task_default_queue)
        while True:
            try:
                message = queue.get(block=False)
            except queue.Empty:
                break
            args, kwargs, _ = message.payload
            results.append(app.tasks[message.headers["task"]].apply(args=args, kwargs=kwargs))
            message.ack()
        queue.close()
    return results


def _raise(what: str):
    def fail(*args, **kwargs):
        raise RuntimeError(what)

    return fail


INVOICE_STAGES = {
    "the task": (tasks, "invoice_run_execute"),
    "the sweep before the run": (invoice_runs, "runs_abandoned_fail"),
    "marking it running": (invoice_runs, "run_start"),
    "inside the run": (invoice_runs, "tenants_by_period"),
}


@pytest.mark.parametrize("stage", INVOICE_STAGES)
def test_an_invoice_run_whose_task_raises_is_failed_with_the_error_on_its_page(
    world, client, broker, monkeypatch, stage
):
    client.force_login(make_finance_user())
    response = client.post("/invoices/runs", {"as_of": "2026-11-02", "drafts": "on"})
    assert response.status_code == 302, response.content
    run = InvoiceRun.objects.get()
    assert run.status == RunStatus.QUEUED
    module, name = INVOICE_STAGES[stage]
    monkeypatch.setattr(module, name, _raise(f"broken at {stage}"))

    (result,) = _work()

    assert result.failed()  # raised on, for Celery to log
    run.refresh_from_db()
    error = f"RuntimeError: broken at {stage}"
    assert (run.status, run.failures) == (RunStatus.FAILED, [{"tenant": "", "error": error}])
    assert run.finished_at is not None
    page = client.get("/invoices/").content.decode()
    row = html.unescape(page.split(f"<td>#{run.pk} (drafts)")[1].split("</tr>")[0])
    assert "Failed" in row and f"1: {error}" in row


def test_an_invoice_run_as_of_year_one_queued_before_the_rule_fails_on_its_page(
    world, client, broker
):
    """A row written before the service refused year 1 (the form let it
    through): the worker's calendar overflows, and the run says so."""
    client.force_login(make_finance_user())
    run = InvoiceRun.objects.create(as_of=datetime(1, 1, 1, tzinfo=UTC), finalize=False)
    tasks.invoice_run_enqueue(run.pk)

    (result,) = _work()

    assert result.failed()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failures[0]["error"].startswith("OverflowError: ")
    page = html.unescape(client.get("/invoices/").content.decode())
    assert f"1: {run.failures[0]['error']}" in page


ALLOCATION_STAGES = {
    "the task": (tasks, "allocation_run_execute"),
    "marking it running": (allocation_runs, "run_start"),
    "inside the run": (allocation_runs, "allocation_book"),
}


@pytest.mark.parametrize("stage", ALLOCATION_STAGES)
def test_an_allocation_run_whose_task_raises_is_failed_with_the_error_on_its_page(
    world, client, broker, monkeypatch, stage
):
    now_hour = timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    yesterday = now_hour.replace(hour=0) - timedelta(days=1)
    client.force_login(make_finance_user())
    response = client.post(
        "/costs/runs", {"first_day": f"{yesterday:%Y-%m-%d}", "last_day": f"{yesterday:%Y-%m-%d}"}
    )
    assert response.status_code == 302, response.content
    run = AllocationRun.objects.get()
    module, name = ALLOCATION_STAGES[stage]
    monkeypatch.setattr(module, name, _raise(f"broken at {stage}"))

    (result,) = _work()

    assert result.failed()
    run.refresh_from_db()
    error = f"RuntimeError: broken at {stage}"
    assert (run.status, run.error) == (RunStatus.FAILED, error)
    page = html.unescape(client.get("/costs/").content.decode())
    row = page.split(f"<td>{run.pk}</td>")[1].split("</tr>")[0]
    assert "Failed" in row and error in row


def test_a_second_delivery_that_fails_leaves_the_run_to_the_worker_executing_it(
    world, client, broker, monkeypatch
):
    """The first worker holds the run's liveness lock (in another process,
    here another session): a second delivery failing before it gets there
    does not fail the run under it."""
    client.force_login(make_finance_user())
    client.post("/invoices/runs", {"as_of": "2026-11-02", "drafts": "on"})
    run = InvoiceRun.objects.get()
    InvoiceRun.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING)
    first = database_session(autocommit=True)
    monkeypatch.setattr(invoice_runs, "runs_abandoned_fail", _raise("a second delivery broke"))
    try:
        first.execute("SELECT pg_advisory_lock(%s, %s)", _liveness_key(InvoiceRun, run.pk))
        (result,) = _work()
    finally:
        first.close()

    assert result.failed()
    run.refresh_from_db()
    assert (run.status, run.failures) == (RunStatus.RUNNING, [])
