"""Who is making a change, for the triggers to record: set on the database
session (gpu_ledger.* settings) before the first write of a request, a job
or a management command, and reset after it. Reads never pay for it."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from celery.signals import task_postrun, task_prerun
from django.db import connection
from django.db.backends.signals import connection_created
from django.dispatch import receiver

from audit.choices import Via

SETTINGS = ("actor", "actor_user_id", "via", "request")
_READS = (
    "SELECT",
    "SHOW",
    "SET",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT",
    "RELEASE",
    "DECLARE",
    "FETCH",
    "CLOSE",
    "MOVE",
)


@dataclass(frozen=True)
class Actor:
    name: str
    via: str
    user_id: int | None = None
    request: str = ""

    def values(self) -> list[str]:
        return [
            self.name[:200],
            "" if self.user_id is None else str(self.user_id),
            self.via,
            self.request[:300],
        ]


NOBODY = Actor(name="", via="")


def actor_for_request(request) -> Actor:
    """The signed-in user, the API key, or the admin user behind a request."""
    user = getattr(request, "user", None)
    where = f"{request.method} {request.path}"
    if user is None or not user.is_authenticated:
        return Actor(name="anonymous", via=Via.SESSION, request=where)
    if getattr(user, "api_key", None) is not None or getattr(user, "service_key", None):
        return Actor(name=str(user), via=Via.API_KEY, request=where)
    via = Via.ADMIN if request.path.startswith("/admin/") else Via.SESSION
    return Actor(name=user.get_username(), via=via, user_id=user.pk, request=where)


def _apply(cursor, actor: Actor) -> None:
    cursor.execute(
        "SELECT " + ", ".join(f"set_config('gpu_ledger.{s}', %s, false)" for s in SETTINGS),
        actor.values(),
    )


_blocks = threading.local()  # the acting_as blocks open on this thread, innermost last


@contextmanager
def acting_as(actor: Actor | Callable[[], Actor]) -> Iterator[None]:
    """Changes made on this thread's connection inside the block are
    recorded as `actor`'s (a callable is asked at the first write: a DRF
    view authenticates after the middleware). Nothing is sent for a block
    that only reads. On leaving, the enclosing block's actor (a task run
    inside a request) or the process's is put back."""
    block: list[Actor] = []  # the actor, once applied
    stack = _blocks.__dict__.setdefault("stack", [])
    stack.append(block)

    def before_first_write(execute, sql, params, many, context):
        # A composed statement (psycopg.sql: DDL such as a new partition)
        # is never one of the plain reads.
        text = sql if isinstance(sql, str) else ""
        if not block and not text.lstrip().upper().startswith(_READS):
            block.append(actor() if callable(actor) else actor)
            _apply(context["cursor"], block[0])
        return execute(sql, params, many, context)

    try:
        with connection.execute_wrapper(before_first_write):
            yield
    finally:
        stack.pop()
        if block and connection.connection is not None:
            enclosing = next((b[0] for b in reversed(stack) if b), process_actor())
            try:
                with connection.cursor() as cursor:
                    _apply(cursor, enclosing)
            except Exception:
                connection.close()


def process_actor() -> Actor:
    """What a process's own writes are recorded as: a management command by
    its name; anything else (the web app outside a request, a worker
    outside a task) as nobody, which the trigger records as its database
    role."""
    argv = sys.argv
    if len(argv) > 1 and argv[0].endswith("manage.py") and argv[1] not in {"runserver"}:
        return Actor(name=f"command:{argv[1]}", via=Via.COMMAND, request=" ".join(argv[1:])[:300])
    return NOBODY


@receiver(connection_created, dispatch_uid="audit.process_actor")
def _process_actor_set(sender, connection, **kwargs) -> None:
    actor = process_actor()
    if actor is not NOBODY:
        with connection.cursor() as cursor:
            _apply(cursor, actor)


_TASK_BLOCKS: dict[str, object] = {}


@task_prerun.connect(dispatch_uid="audit.task_prerun")
def _task_started(task_id=None, task=None, **kwargs) -> None:
    block = acting_as(Actor(name=f"job:{task.name}", via=Via.JOB, request=f"task {task_id}"))
    block.__enter__()
    _TASK_BLOCKS[task_id] = block


@task_postrun.connect(dispatch_uid="audit.task_postrun")
def _task_ended(task_id=None, **kwargs) -> None:
    block = _TASK_BLOCKS.pop(task_id, None)
    if block is not None:
        block.__exit__(None, None, None)
