"""A run's liveness (billing.runs): a run marked running is abandoned only
when no session holds its lock, i.e. its worker's database session is
gone; one whose worker lives stays running; an error a run did not record
fails it with that error. Seen from a second PostgreSQL session, as a
worker in another process is."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest

from billing.choices import RunStatus
from billing.invoicing import runs as invoice_runs
from billing.invoicing.runs import invoice_run_create, invoice_run_execute
from billing.models import InvoiceRun, MarginReport
from billing.runs import ABANDONED, _liveness_key, runs_abandoned_fail
from tests.services import database_session

pytestmark = pytest.mark.django_db(transaction=True)

NOV = datetime(2026, 11, 1, tzinfo=UTC)


def _report(status: str, month: int) -> MarginReport:
    start = datetime(2026, month, 1, tzinfo=UTC)
    return MarginReport.objects.create(
        kind="close",
        period_start=start,
        period_end=datetime(2026, month + 1, 1, tzinfo=UTC),
        previous_start=datetime(2026, month - 1, 1, tzinfo=UTC),
        status=status,
    )


def test_a_running_run_is_abandoned_only_once_its_workers_session_is_gone():
    alive, dead, done = _report("running", 8), _report("running", 9), _report("done", 10)
    worker = database_session(autocommit=True)  # the worker of `alive`, in another process
    worker.execute("SELECT pg_advisory_lock(%s, %s)", _liveness_key(MarginReport, alive.pk))

    assert runs_abandoned_fail(MarginReport) == 1
    statuses = dict(MarginReport.objects.values_list("pk", "status"))
    assert statuses == {alive.pk: "running", dead.pk: "failed", done.pk: "done"}
    assert MarginReport.objects.get(pk=dead.pk).error == ABANDONED

    worker.close()  # the worker dies: PostgreSQL ends its session and its locks
    # (the server ends the session just after the client hangs up)
    deadline = time.monotonic() + 10
    while (failed := runs_abandoned_fail(MarginReport)) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert failed == 1
    assert MarginReport.objects.get(pk=alive.pk).status == "failed"
    assert runs_abandoned_fail(MarginReport) == 0


def test_locks_of_different_kinds_of_run_with_the_same_id_are_distinct():
    report = _report("running", 8)
    run = InvoiceRun.objects.create(as_of=NOV, status="running", pk=report.pk)
    worker = database_session(autocommit=True)
    try:
        worker.execute("SELECT pg_advisory_lock(%s, %s)", _liveness_key(InvoiceRun, run.pk))
        assert runs_abandoned_fail(InvoiceRun) == 0
        assert runs_abandoned_fail(MarginReport) == 1
    finally:
        worker.close()
    assert InvoiceRun.objects.get(pk=run.pk).status == "running"


def test_an_error_the_run_did_not_record_fails_it_with_that_error(monkeypatch):
    run = invoice_run_create(as_of=NOV, finalize=False)

    def broken(**kwargs):
        raise RuntimeError("the calendar is broken")

    monkeypatch.setattr(invoice_runs, "tenants_by_period", broken)
    with pytest.raises(RuntimeError):
        invoice_run_execute(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failures == [{"tenant": "", "error": "RuntimeError: the calendar is broken"}]
    assert run.finished_at is not None
    # Not left running for the sweep to call abandoned.
    assert runs_abandoned_fail(InvoiceRun) == 0
