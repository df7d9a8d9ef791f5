"""Writing usage into the ledger: `usage_record_batch`, all-or-nothing per
batch, idempotent by (request id, phase): a whole request is one row, a
disaggregated one a row per phase.

The fast path: rows are COPYed into a temporary staging table; one INSERT
claims the request ids that are new (metering_usagekey, ON CONFLICT DO
NOTHING), one moves those events into the partitioned ledger, and two more
mark what the new usage invalidates: each (replica, hour) window the
requests were resident in, and each hour whose rollups change. All in one
transaction, so a batch is either wholly recorded or not at all."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connection, transaction

from core.db_copy import copy_to_staging
from metering.partitions import LEDGER_TABLE, usage_partitions_ensure
from metering.validation import LEDGER_COLUMNS, LEDGER_TYPES, EventInvalid, EventValidator

RECEIVED_AT = LEDGER_COLUMNS.index("received_at")
PHASE = LEDGER_COLUMNS.index("phase")
ACCEPTED, DUPLICATE = "accepted", "duplicate"


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


def usage_rows_validate(
    *, events: Iterable[Mapping[str, Any]], source: str, now: datetime | None = None
) -> list[tuple]:
    """Ledger rows for `events`, or BatchRejected listing every bad one."""
    validator = EventValidator(source=source, now=now)
    rows, errors = [], []
    for index, event in enumerate(events):
        try:
            rows.append(validator.row(event))
        except EventInvalid as bad:
            request_id = event.get("request_id") if isinstance(event, Mapping) else None
            errors.append(
                ItemError(
                    index=index,
                    request_id=request_id if isinstance(request_id, str) else None,
                    field=bad.field,
                    message=bad.message,
                )
            )
    if errors:
        raise BatchRejected(errors, total=len(rows) + len(errors))
    return rows


def usage_record_batch(
    *, events: Iterable[Mapping[str, Any]], source: str, now: datetime | None = None
) -> BatchResult:
    """Validate and record `events`. A request id recorded before (or twice
    in the batch) is a duplicate: skipped and counted, not an error. Any
    invalid event rejects the whole batch (BatchRejected, nothing written)."""
    rows = usage_rows_validate(events=events, source=source, now=now)
    return usage_rows_record(rows=rows)


def usage_rows_record(*, rows: Sequence[tuple]) -> BatchResult:
    """Record already validated rows (tuples in LEDGER_COLUMNS order)."""
    result = BatchResult()
    # A row key twice in the batch: the first one counts (no sort needed in SQL).
    unique: dict[tuple[str, str], tuple] = {}
    for row in rows:
        unique.setdefault((row[0], row[PHASE]), row)
    if not unique:
        return result
    usage_partitions_ensure(months={row[RECEIVED_AT] for row in unique.values()})
    with transaction.atomic(), connection.cursor() as cursor, connection.wrap_database_errors:
        raw = cursor.cursor
        staging = copy_to_staging(
            raw,
            table=LEDGER_TABLE,
            columns=LEDGER_COLUMNS,
            rows=unique.values(),
            types=LEDGER_TYPES,
        )
        raw.execute(
            "CREATE TEMP TABLE IF NOT EXISTS _usage_fresh (request_id varchar(128), "
            "phase varchar(8), replica_id bigint, status varchar(16), began timestamptz, "
            "received_at timestamptz, ended_at timestamptz) ON COMMIT DELETE ROWS"
        )
        raw.execute("TRUNCATE _usage_fresh")
        cols = ", ".join(LEDGER_COLUMNS)
        # Each (request id, phase) not seen before is claimed (metering_usagekey);
        # only claimed rows enter the ledger. What they need for the stale
        # marks lands in _usage_fresh.
        raw.execute(
            f"""
            WITH claimed AS (
                INSERT INTO metering_usagekey (request_id, phase, received_at)
                SELECT request_id, phase, received_at FROM {staging}
                ON CONFLICT (request_id, phase) DO NOTHING
                RETURNING request_id, phase
            ), inserted AS (
                INSERT INTO {LEDGER_TABLE} ({cols}, ingested_at)
                SELECT {", ".join("s." + c for c in LEDGER_COLUMNS)}, now()
                FROM {staging} s JOIN claimed USING (request_id, phase)
                RETURNING request_id, phase, replica_id, status,
                          coalesce(sent_at, received_at), received_at, ended_at
            )
            INSERT INTO _usage_fresh SELECT * FROM inserted
            """
        )
        _mark_stale(raw)
        raw.execute("SELECT request_id, phase FROM _usage_fresh")
        fresh = set(raw.fetchall())
    for row in rows:
        key = (row[0], row[PHASE])
        result.request_ids.append(row[0])
        # Only the first row of a key claimed in this batch is the accepted one.
        result.statuses.append(ACCEPTED if key in fresh else DUPLICATE)
        fresh.discard(key)
    return result


# Each (replica, hour) a new request was resident in, from being sent (or
# received) to its end; rejected requests ran nowhere.
_RESIDENT_HOURS = """
    SELECT replica_id, hour FROM (
        SELECT DISTINCT replica_id, date_trunc('hour', began) AS first_hour,
               date_trunc('hour', ended_at) AS last_hour
        FROM _usage_fresh WHERE replica_id IS NOT NULL AND status <> 'rejected'
    ) spans, LATERAL generate_series(first_hour, last_hour, interval '1 hour') AS hour
    GROUP BY replica_id, hour
"""


def _mark_stale(raw) -> None:
    """New usage re-opens the attribution windows it falls in and the
    hours whose rollups it changes."""
    raw.execute(
        f"""
        INSERT INTO metering_attributionwindow
            (replica_id, start, "end", status, policy, gpu_units, capacity_ns,
             attributed_ns, idle_ns, requests, marked_at)
        SELECT replica_id, hour, hour + interval '1 hour', 'pending', '', 0, 0, 0, 0, 0, now()
        FROM ({_RESIDENT_HOURS}) resident
        ON CONFLICT (replica_id, start)
        DO UPDATE SET status = 'pending', marked_at = EXCLUDED.marked_at
        """
    )
    raw.execute(
        f"""
        INSERT INTO metering_dirtyhour (hour, marked_at)
        SELECT hour, now() FROM (
            SELECT hour FROM ({_RESIDENT_HOURS}) resident
            UNION
            SELECT DISTINCT date_trunc('hour', received_at) FROM _usage_fresh
        ) hours
        ON CONFLICT (hour) DO UPDATE SET marked_at = EXCLUDED.marked_at
        """
    )
