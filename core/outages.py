"""Riding out a database outage: which errors mean the database is away
(rather than that a query was wrong), and one log line per episode.

A process that loses its database (the web app, a Celery worker or beat,
the gateway) keeps going and tries again; what it logs is one WARNING when
the episode starts, naming the first thing that failed, and one INFO when
a connection is made again, saying how long it lasted and how many
failures it kept quiet meanwhile. Not a traceback per attempt: during a
minute's outage those were hundreds of lines, every one the same.

Two ways in: code that catches the error calls `database_outage_report`
(and logs as before when it returns False: then it is a bug, not an
outage); and the console handler's `OutageLogFilter` (settings.LOGGING)
turns any record carrying an outage error as its exc_info (Django's
request log, Celery's task trace, django-celery-beat's) into the same one
line. Recovery is heard from Django's `connection_created` signal."""

from __future__ import annotations

import logging
import threading
import time

from core.db_errors import database_away, sqlstate_away

logger = logging.getLogger(__name__)

# Seconds between tries while the database is away: doubling up to a cap.
BACKOFF_FIRST = 1.0
BACKOFF_MAX = 30.0


def database_outage(exc: BaseException | None) -> bool:
    """Whether `exc` (or what it was raised from) says the database is
    unreachable: an OperationalError, Django's or psycopg's, that no server
    answered or whose SQLSTATE is a connection failure or a shutdown
    (core.db_errors), or Django's InterfaceError (a connection closed under
    us). A query that failed on a live connection (a deadlock, a lock
    timeout, a constraint: DatabaseErrors too) is not an outage."""
    import psycopg
    from django.db import InterfaceError

    seen = 0
    while exc is not None and seen < 5:
        if database_away(exc) or isinstance(exc, InterfaceError):
            return True
        if isinstance(exc, psycopg.OperationalError) and sqlstate_away(exc.sqlstate):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def backoff_seconds(
    attempt: int, *, first: float = BACKOFF_FIRST, cap: float = BACKOFF_MAX
) -> float:
    """The wait before try `attempt` (1, 2, ...) after a failure: first,
    then doubling, never more than `cap`."""
    return min(cap, first * 2 ** max(0, attempt - 1))


class OutageEpisode:
    """One dependency's outages in this process: `failed` when an attempt
    failed for it (the first of an episode is logged), `recovered` when an
    attempt succeeded (logged if an episode was on)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._lock = threading.Lock()
        self.started_at: float | None = None  # monotonic; None: no episode on
        self.failures = 0  # in this episode
        self.episodes = 0  # since the process started

    @property
    def active(self) -> bool:
        return self.started_at is not None

    def failed(self, exc: BaseException, *, doing: str, log: logging.Logger = logger) -> bool:
        """Count a failure; the first of an episode logs one WARNING (what
        failed, doing what); True when it did."""
        if not self.counted():
            return False
        log.warning(self.start_line(exc, doing=doing))
        return True

    def counted(self) -> bool:
        """Count a failure without logging it; True when it began an episode."""
        with self._lock:
            self.failures += 1
            if self.started_at is not None:
                return False
            self.started_at = time.monotonic()
            self.failures = 1
            self.episodes += 1
        return True

    def start_line(self, exc: BaseException, *, doing: str) -> str:
        return (
            f"{doing}: the {self.what} is unavailable ({_one_line(exc)}); "
            f"retrying with backoff, quiet until it is back"
        )

    def backoff(self) -> float:
        """The wait before the next try in this episode."""
        return backoff_seconds(max(1, self.failures))

    def recovered(self, *, log: logging.Logger = logger) -> bool:
        """End the episode, if one is on, with one INFO line; True when it did."""
        with self._lock:
            if self.started_at is None:
                return False
            lasted = time.monotonic() - self.started_at
            failures, self.started_at, self.failures = self.failures, None, 0
        log.info(
            "the %s is available again after %.0f s (%d failed attempts kept quiet)",
            self.what,
            lasted,
            failures,
        )
        return True


# The process's database: every caller shares it, so an outage is one
# episode however many loops notice it.
DATABASE = OutageEpisode("database")


def database_outage_report(exc: BaseException, *, doing: str, log: logging.Logger = logger) -> bool:
    """When `exc` is a database outage: counted into the episode (its first
    failure logged as one WARNING line) and True; else False, and the
    caller logs `exc` as it would have (a bug is still a traceback)."""
    if not database_outage(exc):
        return False
    DATABASE.failed(exc, doing=doing, log=log)
    return True


def database_connected(sender=None, connection=None, **kwargs) -> None:
    """Django's connection_created: a connection made ends an episode."""
    DATABASE.recovered()


class OutageLogFilter(logging.Filter):
    """On the console handler: a record whose exc_info is a database outage
    becomes the episode's one WARNING line (without its traceback) when it
    is the first of the episode, and is dropped when it is not; a refused
    connection to another server (Redis, a replica) is its message and the
    error's one line, at WARNING, without the traceback. Celery's
    "retry" lines for a task put off by the outage are dropped meanwhile."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and database_outage(exc):
            doing = _message(record)
            if not DATABASE.counted():
                return False
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg, record.args = DATABASE.start_line(exc, doing=doing), ()
            record.exc_info = record.exc_text = record.stack_info = None
            return True
        if isinstance(exc, ConnectionRefusedError):  # a server away: its line, not a traceback
            record.msg, record.args = f"{_message(record)} ({_one_line(exc)})", ()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = record.stack_info = None
            return True
        return not (
            DATABASE.active
            and record.name == "celery.app.trace"
            and record.levelno <= logging.INFO
            and " retry: " in _message(record)
        )


def _message(record: logging.LogRecord) -> str:
    try:
        text = record.getMessage()
    except (TypeError, ValueError):
        text = str(record.msg)
    return text.splitlines()[0] if text else record.name


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


class DatabaseOutageMiddleware:
    """A view that failed because the database is away answers 503 with
    Retry-After (the API's error shape under /api/, plain text elsewhere),
    counted into the episode rather than logged as a 500 with its
    traceback, request after request."""

    RETRY_AFTER_SECONDS = 5

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not database_outage_report(exception, doing=f"{request.method} {request.path}"):
            return None
        return database_unavailable_response(
            api=request.path.startswith("/api/"), retry_after=self.RETRY_AFTER_SECONDS
        )


def database_unavailable_response(*, api: bool, retry_after: int):
    """The 503 for a request the database's absence failed, marked as
    logged: the episode said it once already."""
    from django.http import HttpResponse, JsonResponse

    message = "the database is unavailable: try again shortly"
    if api:
        body = {"error": {"code": "database_unavailable", "message": message, "field": None}}
        response = JsonResponse(body, status=503)
    else:
        response = HttpResponse(message + "\n", status=503, content_type="text/plain")
    response["Retry-After"] = str(retry_after)
    response._has_been_logged = True  # Django's request log: the episode's line is enough
    return response
