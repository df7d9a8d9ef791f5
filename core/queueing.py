"""Follow-up work handed on once the current transaction commits (a Celery
task, an email). By then the write that asked for it has committed, so a
refusal (the broker down or misconfigured, the mail server away) must not
turn a done write into an error: it is logged, `on_refused` records it on
the row that asked, and that row's state says what picks the work up (a
sweep job for a pending row; a person, for a run marked failed)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)


def after_commit(
    send: Callable[[], object],
    *,
    what: str,
    on_refused: Callable[[str], object] | None = None,
) -> None:
    """Call `send` after the commit (at once outside a transaction). If it
    raises, log it and pass `on_refused` a one-line reason; never raise."""

    def hand_on() -> None:
        try:
            send()
        except Exception as exc:
            reason = f"not queued: {type(exc).__name__}: {exc}"[:2000]
            logger.exception("%s: %s; the write stands", what, reason)
            if on_refused is None:
                return
            try:
                on_refused(reason)
            except Exception:
                logger.exception("%s: could not record that it was not queued", what)

    transaction.on_commit(hand_on)


def task_send(
    name: str,
    *args,
    what: str,
    on_refused: Callable[[str], object] | None = None,
    countdown: float | None = None,
) -> None:
    """Queue the Celery task registered as `name` with `args` after the
    commit, as `after_commit` does. By name, so the service asking imports
    nothing of the tasks module (which imports the services)."""
    after_commit(
        lambda: current_app.send_task(name, args=args, countdown=countdown),
        what=what,
        on_refused=on_refused,
    )
