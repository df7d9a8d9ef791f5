"""Writing usage into the ledger: `usage_record_batch`, all-or-nothing per
batch, idempotent by (request id, phase): a whole request is one row, a
disaggregated one a row per phase.

The fast path, for a batch of new usage (what a gateway's flush or a
client's first POST is): each event is validated and at once streamed,
by binary COPY, into the partitioned ledger, so PostgreSQL takes in the
rows while Python checks the next ones; then the batch's keys are COPYed
into metering_usagekey, whose unique index makes a key recorded before
fail the COPY; then the (replica, hour) windows and the hours the new
usage changes are marked stale. One transaction: a batch is wholly
recorded or not at all.

When the fast path fails on a key recorded before (a replay, a retried
flush), a key another writer holds, or a month with no partition yet, its
transaction is rolled back and the batch, already validated, takes the
careful path: partitions ensured, the keys claimed in key order by
INSERT ... ON CONFLICT DO NOTHING, and only the rows whose key was claimed
COPYed into the ledger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import psycopg
from django.db import DatabaseError, connection, transaction
from psycopg import sql

from core.calendar import epoch_hour_start, moment_epoch_hour
from core.db_copy import copy_into, copy_to_staging, copy_writer
from core.db_errors import database_away
from metering.partitions import LEDGER_TABLE, usage_partitions_ensure
from metering.validation import (
    LEDGER_COLUMNS,
    LEDGER_TYPES,
    DirectoryStale,
    EventInvalid,
    EventValidator,
)
from serving.choices import RequestStatus

RECEIVED_AT = LEDGER_COLUMNS.index("received_at")
SENT_AT = LEDGER_COLUMNS.index("sent_at")
ENDED_AT = LEDGER_COLUMNS.index("ended_at")
REPLICA = LEDGER_COLUMNS.index("replica_id")
STATUS = LEDGER_COLUMNS.index("status")
PHASE = LEDGER_COLUMNS.index("phase")
ACCEPTED, DUPLICATE = "accepted", "duplicate"
KEY_TABLE = "metering_usagekey"
KEY_COLUMNS = ("request_id", "phase", "received_at")
KEY_TYPES = ("varchar", "varchar", "timestamptz")
FAST_PATH_LOCK_WAIT_MS = 50  # then the careful path (see _record_fast)
DEADLOCK_ATTEMPTS = 3  # of the careful path, when PostgreSQL picks it


@dataclass(frozen=True)
class ItemError:
    index: int
    request_id: str | None
    field: str
    message: str


class BatchRejected(Exception):
    """At least one event is invalid; nothing of the batch was written."""

    def __init__(self, errors: list[ItemError], total: int) -> None:
        first = errors[0]
        super().__init__(
            f"{len(errors)} of {total} events rejected; first: event {first.index} "
            f"{first.field}: {first.message}"
        )
        self.errors = errors
        self.total = total


@dataclass
class BatchResult:
    """What became of each row, in the order given: "accepted" or "duplicate"."""

    request_ids: list[str] = field(default_factory=list)
    statuses: list[str] = field(default_factory=list)

    @property
    def accepted(self) -> list[str]:
        return [r for r, s in zip(self.request_ids, self.statuses, strict=True) if s == ACCEPTED]

    @property
    def duplicates(self) -> list[str]:
        return [r for r, s in zip(self.request_ids, self.statuses, strict=True) if s == DUPLICATE]

    @property
    def accepted_count(self) -> int:
        return self.statuses.count(ACCEPTED)

    @property
    def duplicate_count(self) -> int:
        return self.statuses.count(DUPLICATE)


class _Batch:
    """Validated rows of one batch: each event's row in order, the first
    row of each key (the one that counts), and every bad event."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []
        self.first: dict[tuple[str, str], tuple] = {}
        self.errors: list[ItemError] = []
        self.stale = False  # an offline validator met a name it does not know
        self.complete = False  # every event was looked at

    def validate(self, events: Iterable, validator: EventValidator, *, write=None) -> None:
        """Check every event; hand each first row of a key to `write` (a
        COPY's write_row) while the batch is still good. A write that fails
        (the server refused an earlier row) stops the writing, not the
        checking: the caller decides from the whole batch."""
        for index, event in enumerate(events):
            try:
                row = self.add(index, event, validator)
            except DirectoryStale:
                self.stale = True
                return
            if row is None or write is None or self.errors:
                continue
            try:
                write(row)
            except psycopg.Error:
                write = None  # the COPY's end reports the server's error
        self.complete = True

    def add(self, index: int, event: Any, validator: EventValidator) -> tuple | None:
        """The event's row if it is the first of its key, else None."""
        try:
            row = validator.row(event)
        except EventInvalid as bad:
            request_id = event.get("request_id") if isinstance(event, Mapping) else None
            self.errors.append(
                ItemError(
                    index=index,
                    request_id=request_id if isinstance(request_id, str) else None,
                    field=bad.field,
                    message=bad.message,
                )
            )
            return None
        self.rows.append(row)
        key = (row[0], row[PHASE])
        if key in self.first:
            return None
        self.first[key] = row
        return row

    def check(self) -> None:
        """Raise what makes the batch unrecordable: a name to look up
        (DirectoryStale), or invalid events (BatchRejected)."""
        if self.stale:
            raise DirectoryStale("an event names what the directory does not know")
        if self.errors:
            raise BatchRejected(self.errors, total=len(self.rows) + len(self.errors))

    def result(self, fresh: set[tuple[str, str]]) -> BatchResult:
        """Only the first row of a key claimed by this batch is accepted."""
        if len(fresh) == len(self.rows):  # every row new (a gateway's flush)
            return BatchResult(
                request_ids=[row[0] for row in self.rows], statuses=[ACCEPTED] * len(self.rows)
            )
        result = BatchResult()
        fresh = set(fresh)
        for row in self.rows:
            key = (row[0], row[PHASE])
            result.request_ids.append(row[0])
            result.statuses.append(ACCEPTED if key in fresh else DUPLICATE)
            fresh.discard(key)
        return result


def usage_rows_validate(
    *, events: Iterable[Mapping[str, Any]], source: str, now: datetime | None = None
) -> list[tuple]:
    """Ledger rows for `events`, or BatchRejected listing every bad one."""
    batch = _Batch()
    batch.validate(events, EventValidator(source=source, now=now))
    batch.check()
    return batch.rows


def usage_record_batch(
    *, events: Iterable[Mapping[str, Any]], source: str, now: datetime | None = None
) -> BatchResult:
    """Validate and record `events`. A request id recorded before (or twice
    in the batch) is a duplicate: skipped and counted, not an error. Any
    invalid event rejects the whole batch (BatchRejected, nothing written)."""
    events = events if isinstance(events, Sequence) else list(events)
    validator = EventValidator(source=source, now=now, offline=True)
    try:
        return _record_fast(events, validator)
    except DirectoryStale:
        # A name met while the COPY held the connection: once more, with
        # the directory reloaded first.
        return _record_fast(events, validator.refreshed())


def _record_fast(events: Sequence[Mapping[str, Any]], validator: EventValidator) -> BatchResult:
    batch = _Batch()
    try:
        with transaction.atomic(), connection.cursor() as cursor, connection.wrap_database_errors:
            raw = cursor.cursor
            # The rows and keys of new usage wait for no one; a wait means a
            # writer holds a key of ours, and then the careful path is quicker
            # than a deadlock's detection (a second).
            raw.execute(f"SET LOCAL lock_timeout = '{FAST_PATH_LOCK_WAIT_MS}ms'")
            with _ledger_copy(raw) as copy:
                batch.validate(events, validator, write=copy.write_row)
            batch.check()  # a bad batch rolls back what it streamed
            if batch.first:
                _keys_copy(raw, batch.first)
            # Windows are shared: their marks wait their turn. (Also what a
            # caller's own transaction goes on with.)
            raw.execute("SET LOCAL lock_timeout TO DEFAULT")
            if batch.first:
                usage_mark_stale(raw, batch.first.values())
    except DatabaseError as error:
        batch.check()  # the batch's own fault first, whatever the server said
        if not batch.complete or database_away(error):  # the careful path would wait again
            raise
        # A key recorded before, a month without its partition yet, a
        # deadlock with a writer sharing keys: the fast path was rolled back
        # whole, every row is valid, and the careful path sorts it out (or
        # raises what is really wrong).
        return batch.result(_record_careful(batch.first))
    return batch.result(set(batch.first))


def _record_careful(first: dict[tuple[str, str], tuple]) -> set[tuple[str, str]]:
    """Claim each key not recorded before and write only those rows;
    returns the keys claimed. Claims go in key order, so careful writers
    never deadlock with each other; one that meets a fast-path writer
    holding a ledger row of a key claimed here may, until the fast path's
    lock timeout sends it away. If PostgreSQL picks this one, it starts
    again (and then finds the key taken or free)."""
    usage_partitions_ensure(months={row[RECEIVED_AT] for row in first.values()})
    attempts = 1
    while True:
        try:
            return _claim_and_write(first)
        except DatabaseError as error:
            deadlock = isinstance(error.__cause__, psycopg.errors.DeadlockDetected)
            if not deadlock or attempts == DEADLOCK_ATTEMPTS:
                raise
            attempts += 1


def _claim_and_write(first: dict[tuple[str, str], tuple]) -> set[tuple[str, str]]:
    with transaction.atomic(), connection.cursor() as cursor, connection.wrap_database_errors:
        raw = cursor.cursor
        staging = copy_to_staging(
            raw,
            table=KEY_TABLE,
            columns=KEY_COLUMNS,
            rows=key_rows(first.values()),
            types=KEY_TYPES,
        )
        cols = sql.SQL(", ").join(map(sql.Identifier, KEY_COLUMNS))
        raw.execute(
            sql.SQL(
                "INSERT INTO {} ({}) SELECT {} FROM {} ORDER BY request_id, phase "
                "ON CONFLICT (request_id, phase) DO NOTHING RETURNING request_id, phase"
            ).format(sql.Identifier(KEY_TABLE), cols, cols, sql.SQL(staging))
        )
        fresh = set(raw.fetchall())
        rows = [row for key, row in first.items() if key in fresh]
        copy_into(raw, table=LEDGER_TABLE, columns=LEDGER_COLUMNS, rows=rows, types=LEDGER_TYPES)
        usage_mark_stale(raw, rows)
    return fresh


def _ledger_copy(raw):
    return copy_writer(raw, table=LEDGER_TABLE, columns=LEDGER_COLUMNS, types=LEDGER_TYPES)


def key_rows(rows: Iterable[tuple]) -> list[tuple]:
    """The key table's rows (KEY_COLUMNS) of ledger rows."""
    return [(row[0], row[PHASE], row[RECEIVED_AT]) for row in rows]


def _keys_copy(raw, first: dict[tuple[str, str], tuple]) -> None:
    """Claim every key of the batch at once: a key recorded before fails
    the COPY (UniqueViolation), a key another writer holds makes it wait
    (until the fast path's lock timeout)."""
    copy_into(
        raw, table=KEY_TABLE, columns=KEY_COLUMNS, rows=key_rows(first.values()), types=KEY_TYPES
    )


def usage_mark_stale(raw, rows: Iterable[tuple]) -> None:
    """New usage re-opens the attribution windows it falls in (each
    (replica, hour) a served request was resident in, from being sent, or
    received, to its end; a rejected request ran nowhere) and the hours
    whose rollups it changes (those, and the hours it was received in)."""
    usage_stale_mark(raw, usage_stale_of(rows))


def usage_stale_of(rows: Iterable[tuple]) -> tuple[list[tuple[int, int]], list[int]]:
    """What `rows` re-open: their (replica, epoch hour) windows, sorted, and
    their epoch hours (usage_mark_stale)."""
    spans: set[tuple[int, int, int]] = set()
    hours: set[int] = set()
    for row in rows:
        received = row[RECEIVED_AT]
        hours.add(moment_epoch_hour(received))
        replica = row[REPLICA]
        if replica is not None and row[STATUS] != RequestStatus.REJECTED:
            began = row[SENT_AT] or received
            spans.add((replica, moment_epoch_hour(began), moment_epoch_hour(row[ENDED_AT])))
    windows = {(replica, hour) for replica, a, b in spans for hour in range(a, b + 1)}
    hours.update(hour for _, hour in windows)
    # Sorted: concurrent writers touch shared rows in one order.
    return sorted(windows), sorted(hours)


def usage_stale_mark(raw, stale: tuple[list[tuple[int, int]], list[int]]) -> None:
    """The windows and hours `usage_stale_of` found marked pending, now."""
    resident, hours = stale
    if not hours:
        return
    raw.execute(
        """
        INSERT INTO metering_attributionwindow
            (replica_id, start, "end", status, policy, gpu_units, capacity_ns,
             attributed_ns, idle_ns, requests, marked_at)
        SELECT replica_id, hour, hour + interval '1 hour', 'pending', '', 0, 0, 0, 0, 0, now()
        FROM unnest(%s::bigint[], %s::timestamptz[]) AS resident (replica_id, hour)
        ON CONFLICT (replica_id, start)
        DO UPDATE SET status = 'pending', marked_at = EXCLUDED.marked_at
        """,
        [[r for r, _ in resident], [epoch_hour_start(h) for _, h in resident]],
    )
    raw.execute(
        """
        INSERT INTO metering_dirtyhour (hour, marked_at)
        SELECT hour, now() FROM unnest(%s::timestamptz[]) AS hours (hour)
        ON CONFLICT (hour) DO UPDATE SET marked_at = EXCLUDED.marked_at
        """,
        [[epoch_hour_start(h) for h in hours]],
    )
