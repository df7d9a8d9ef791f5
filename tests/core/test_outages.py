"""A database outage is told from a wrong query, said once per episode, and
ridden out by beat's scheduler: its database stopped for real (a PostgreSQL
of the test's own), beat goes on ticking from the schedule it last read,
and what it could not save is saved once the database is back."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

import psycopg
import pytest
from django.db import IntegrityError, OperationalError

from core import outages
from core.beat import OutageTolerantScheduler
from core.outages import DATABASE, OutageLogFilter, database_outage


@pytest.fixture(autouse=True)
def no_episode_on():
    DATABASE.recovered()
    yield
    DATABASE.recovered()


def _django_error(sqlstate: str | None) -> OperationalError:
    cause = psycopg.OperationalError("server closed the connection")
    if sqlstate is not None:
        cause.sqlstate = sqlstate  # as psycopg's diagnostics carry it
    try:
        raise OperationalError(str(cause)) from cause
    except OperationalError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("error", "outage"),
    [
        (_django_error(None), True),  # no server answered
        (_django_error("08006"), True),  # connection failure
        (_django_error("57P01"), True),  # admin shutdown
        (_django_error("40P01"), False),  # a deadlock: a live server said no
        (IntegrityError("duplicate key"), False),
        (ValueError("not the database"), False),
    ],
)
def test_an_outage_is_told_from_a_query_that_failed(error, outage):
    assert database_outage(error) is outage


def _record(exc: BaseException | None, message="could not record API key use", name="gateway"):
    return logging.LogRecord(
        name, logging.ERROR, __file__, 1, message, (), (type(exc), exc, None) if exc else None
    )


def test_an_outage_is_one_warning_line_per_episode_without_its_traceback():
    log_filter = OutageLogFilter()
    first, again = _record(_django_error(None)), _record(_django_error("08006"))
    assert log_filter.filter(first) is True
    assert first.levelname == "WARNING" and first.exc_info is None
    assert first.getMessage().startswith(
        "could not record API key use: the database is unavailable (OperationalError: "
    )
    assert log_filter.filter(again) is False  # the same episode: quiet
    bug = _record(IntegrityError("duplicate key"))
    assert log_filter.filter(bug) is True and bug.exc_info is not None  # a bug keeps its trace
    DATABASE.recovered()
    assert log_filter.filter(_record(_django_error(None))) is True  # a new episode


def test_a_connection_made_ends_the_episode_in_one_info_line(caplog, db):
    from django.db import connections

    assert DATABASE.failed(_django_error(None), doing="a test")
    fresh = connections.create_connection("default")
    with caplog.at_level(logging.INFO, logger="core.outages"):
        fresh.ensure_connection()  # connection_created: core.apps
    fresh.close()
    assert not DATABASE.active
    (line,) = [
        r.getMessage()
        for r in caplog.records
        if r.name == "core.outages" and r.levelno == logging.INFO
    ]
    assert line.startswith("the database is available again after ")
    assert line.endswith("(1 failed attempts kept quiet)")


def test_backoff_doubles_up_to_its_cap():
    assert [outages.backoff_seconds(n) for n in (1, 2, 3, 6, 9)] == [1, 2, 4, 30, 30]


def test_beat_rides_out_its_database_stopped_and_saves_what_ran_once_back(own_postgres, caplog):
    from config.celery_app import app

    sent: list[str] = []
    scheduler = OutageTolerantScheduler(app=app, lazy=False)
    scheduler.apply_async = lambda entry, *args, **kwargs: sent.append(entry.name)
    names = set(scheduler.schedule)
    assert "metering-run" in names  # the settings' schedule, read from the database
    entry = scheduler.schedule["metering-run"]
    scheduler.reserve(entry)  # it ran: its run to save

    own_postgres.stop()
    try:
        with caplog.at_level(logging.INFO):
            # The stock scheduler raised out of beat here (a full re-read
            # every five minutes): beat exited with code 1.
            scheduler._last_full_sync = datetime.now() - timedelta(minutes=10)
            waits = [scheduler.tick() for _ in range(3)]
            assert set(scheduler.schedule) == names  # the schedule it last read
            scheduler.sync()
        assert all(0 < wait <= 30 for wait in waits)
        assert "metering-run" in scheduler._dirty  # kept to save
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "the database is unavailable" in warnings[0].getMessage()
        assert all(r.exc_info is None for r in caplog.records)
    finally:
        own_postgres.start()

    scheduler.tick()
    scheduler.sync()
    assert not DATABASE.active and not scheduler._dirty
    from django_celery_beat.models import PeriodicTask

    saved = PeriodicTask.objects.get(name="metering-run")
    assert saved.total_run_count == 1 and saved.last_run_at is not None
