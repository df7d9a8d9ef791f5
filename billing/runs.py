"""The lifecycle of billing's background runs (billing.models.runs):
queued -> running -> done | failed, each step one UPDATE of the run's row
(a person watching its page sees it move), the run in memory kept the same.
Each run adds its own columns to a step: its progress counters, its
warnings, where its error goes."""

from __future__ import annotations

from django.db.models import QuerySet
from django.utils import timezone

from billing.choices import RunStatus
from billing.models.runs import RunLifecycle


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
