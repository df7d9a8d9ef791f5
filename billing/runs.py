"""The lifecycle of billing's background runs (billing.models.runs):
queued -> running -> done | failed, each step one UPDATE of the run's row
(a person watching its page sees it move), the run in memory kept the same.
Each run adds its own columns to a step: its progress counters, its
warnings, where its error goes (RunLifecycle.failed_because).

A run executes holding its liveness lock (`run_executing`): a PostgreSQL
session lock of the worker's connection, which the server releases when
that connection goes, however the worker died (SIGKILL, out of memory, a
lost host). A run marked running whose lock is free has no worker left:
`runs_abandoned_fail` marks it failed, so its page stops saying running
(the broker hands the message again only after its visibility timeout, an
hour; running it again is safe). A run's Celery task runs inside
`run_task`, so an error before the run gets that far fails it too."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db.models import QuerySet
from django.utils import timezone

from billing.choices import RunStatus
from billing.models.runs import RunLifecycle
from core.locks import advisory_lock, advisory_lock_try
from core.queueing import after_commit

logger = logging.getLogger(__name__)
ABANDONED = "abandoned: its worker stopped before finishing (run it again to complete)"


@contextmanager
def run_executing(run: RunLifecycle) -> Iterator[None]:
    """Hold `run`'s liveness lock while it executes. A second delivery of
    the same run waits here for the first to end, then runs it again. An
    error the run did not record fails it with that error."""
    with advisory_lock(_liveness_key(type(run), run.pk)):
        try:
            yield
        except Exception as exc:
            runs_fail(
                type(run).objects.filter(pk=run.pk, status=RunStatus.RUNNING),
                **run.failed_because(f"{type(exc).__name__}: {exc}"),
            )
            raise


@contextmanager
def run_task(model: type[RunLifecycle], pk: int) -> Iterator[None]:
    """The task of `model`'s run `pk`: an error escaping it fails the run
    with that error unless a worker executes the run now (it holds the
    liveness lock) or the run has finished, and is raised on. What
    run_executing records happens inside the run; this covers the rest:
    reading the run's row, the sweep before it, an error before the run
    is marked running (nothing else would move it from queued)."""
    try:
        yield
    except Exception as exc:
        try:
            _unfinished_fail(model, pk, reason=f"{type(exc).__name__}: {exc}")
        except Exception:  # the database too is gone: the sweep or a person picks it up
            logger.exception("%s %s: could not record that it failed", model.__name__, pk)
        raise


def _unfinished_fail(model: type[RunLifecycle], pk: int, *, reason: str) -> None:
    with advisory_lock_try(_liveness_key(model, pk)) as free:
        if free:
            runs_fail(
                model.objects.filter(pk=pk, status__in=[RunStatus.QUEUED, RunStatus.RUNNING]),
                **model.failed_because(reason),
            )


def runs_abandoned_fail(model: type[RunLifecycle]) -> int:
    """`model`'s runs marked running whose worker is gone (nobody holds
    their liveness lock): failed as abandoned; how many. Checked holding
    the lock, so a worker that starts the run meanwhile waits and then
    runs it whole."""
    failed = 0
    for pk in model.objects.filter(status=RunStatus.RUNNING).values_list("pk", flat=True):
        with advisory_lock_try(_liveness_key(model, pk)) as free:
            if free:
                failed += runs_fail(
                    model.objects.filter(pk=pk, status=RunStatus.RUNNING),
                    **model.failed_because(ABANDONED),
                )
    return failed


def _liveness_key(model: type[RunLifecycle], pk: int) -> tuple[int, int]:
    # A namespace of the model's table (stable across processes and
    # releases: crc32, not Python's salted hash) and the run's id.
    return zlib.crc32(model._meta.db_table.encode()) & 0x7FFFFFFF, pk & 0x7FFFFFFF


def run_start(run: RunLifecycle, **fields) -> None:
    """Running from now (started_at, on a run that keeps it), with the
    run's own columns reset."""
    if any(field.name == "started_at" for field in run._meta.concrete_fields):
        fields["started_at"] = timezone.now()
    _write(run, status=RunStatus.RUNNING, **fields)


def run_progress(run: RunLifecycle, **fields) -> None:
    """How far the run has got (its own counters)."""
    _write(run, **fields)


def run_finish(run: RunLifecycle, *, failed: bool = False, **fields) -> None:
    """Done, or failed (`fields` say why), as of now."""
    status = RunStatus.FAILED if failed else RunStatus.DONE
    _write(run, status=status, finished_at=timezone.now(), **fields)


def runs_fail(runs: QuerySet, **fields) -> int:
    """Runs that will not finish (their worker was lost, the broker refused
    them): failed as of now, `fields` saying why; how many."""
    return runs.update(status=RunStatus.FAILED, finished_at=timezone.now(), **fields)


def _write(run: RunLifecycle, **fields) -> None:
    type(run).objects.filter(pk=run.pk).update(**fields)
    for name, value in fields.items():
        setattr(run, name, value)


def run_enqueue(task, model, pk: int, *, what: str, **failed) -> None:
    """Hand a created run (allocation, invoices, margin report, plan) to a worker
    once its row is committed. If the broker refuses, the row is marked
    failed with the reason (its page shows it; start it again), not left
    queued forever. `failed` names where the reason goes."""
    after_commit(
        lambda: task.delay(pk),
        what=f"{what} {pk}",
        on_refused=lambda reason: runs_fail(
            model.objects.filter(pk=pk, status=RunStatus.QUEUED),
            **{field: make(reason) for field, make in failed.items()},
        ),
    )
