"""django-celery-beat's database scheduler, riding out a database outage.

The stock scheduler logs a traceback on every tick while the database is
away, and its full re-read of the schedule (every five minutes, or at
start) raises out of beat, which exits with code 1: under `./dev up` that
stopped the whole stack. This one keeps the schedule it last read and
keeps sending from it (the broker is not the database), tries the
database again with backoff, and says so once per outage (core.outages).
What it could not save (entries' last run times) is saved once the
database is back."""

from __future__ import annotations

import contextlib
import logging
import time

from django.db import close_old_connections
from django_celery_beat.schedulers import DatabaseScheduler

from core.outages import DATABASE, database_outage, database_outage_report

logger = logging.getLogger(__name__)


class OutageTolerantScheduler(DatabaseScheduler):
    """DatabaseScheduler that survives the database going away."""

    def setup_schedule(self):
        # At start the schedule must be read once: until then, wait and retry.
        while True:
            try:
                super().setup_schedule()
                return
            except Exception as exc:
                if not database_outage_report(exc, doing="beat reading its schedule", log=logger):
                    raise
                self._initial_read = True  # read it whole on the next try
                _connections_reset()
                time.sleep(DATABASE.backoff())

    def tick(self, *args, **kwargs):
        """One round; while the database is away, the next round comes
        after the episode's backoff (a few seconds, doubling up to 30)."""
        try:
            return super().tick(*args, **kwargs)
        except Exception as exc:
            if not database_outage_report(exc, doing="beat sending due tasks", log=logger):
                raise
            _connections_reset()
            return DATABASE.backoff()

    def schedule_changed(self):
        """Whether the schedule changed; False while the database is away
        (the stock one logs a traceback for that, every tick)."""
        try:
            close_old_connections()
            last, ts = self._last_timestamp, self.Changes.last_change()
        except Exception as exc:
            if not database_outage_report(exc, doing="beat checking its schedule", log=logger):
                raise
            _connections_reset()
            return False
        try:
            return bool(ts and ts > (last or ts))
        finally:
            self._last_timestamp = ts

    def sync(self):
        """Save the entries that ran; while the database is away they stay
        to save on the next sync."""
        tried: set[str] = set()
        try:
            close_old_connections()
            while self._dirty:
                name = self._dirty.pop()
                tried.add(name)
                entry = self._schedule.get(name) if self._schedule else None
                if entry is not None:
                    entry.save()
                tried.discard(name)
        except Exception as exc:
            if not database_outage(exc):
                raise
            database_outage_report(exc, doing="beat saving its entries", log=logger)
            self._dirty |= tried
            _connections_reset()

    @property
    def schedule(self):
        """The schedule, read again when it changed; the last one read
        while the database is away (a full re-read failing no longer
        leaves beat without one)."""
        kept = self._schedule
        try:
            return super().schedule
        except Exception as exc:
            if kept is None or not database_outage(exc):
                raise
            database_outage_report(exc, doing="beat re-reading its schedule", log=logger)
            _connections_reset()
            self._schedule = kept
            return kept


def _connections_reset() -> None:
    """Drop a connection the outage broke, so the next try makes a new one
    (whose creation ends the episode: core.outages)."""
    from django.db import connections

    for conn in connections.all(initialized_only=True):
        # A broken connection may fail to close; it is gone anyway.
        with contextlib.suppress(Exception):
            conn.close()
