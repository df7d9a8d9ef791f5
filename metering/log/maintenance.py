"""Upkeep of the raw-event store (the `metering.store_maintain` task,
hourly, and `manage.py usage_store maintain`).

The writers commit every few seconds, each commit a small Parquet file per
hour it touches: an hour ends as thousands of files, and the table's log
as thousands of commits. So, for every closed hour (past the longest
request and an hour's grace) with more than one file:

- compact: its files rewritten as a few large ones (zstd), in one commit
  that changes no row; a writer's late commit to the same hour at that
  moment wins and the compaction is tried again on the next pass;
- then a checkpoint of the table's log (readers start from it, not from
  every commit), the log entries past the table's log retention removed;
- vacuum: the files no commit refers to any more, once older than
  USAGE_STORE_VACUUM_HOURS (a reader of an older snapshot, an hour job
  that began before a compaction, still finds its files until then);
- retention: hours older than USAGE_STORE_RETENTION_MONTHS deleted (0,
  the default: the store keeps everything; it is the archive).

Compaction keeps the writers' positions (the partitions' application
transactions): they are table state, not files."""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, WriterProperties
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from django.conf import settings

from core.calendar import months_add
from metering.log.store import HOUR, hour_key
from metering.log.stream import LogConfig

logger = logging.getLogger(__name__)

TARGET_FILE_BYTES = 256 * 1024 * 1024
GRACE = timedelta(hours=1)


@dataclass
class Maintenance:
    compacted: list[str] = field(default_factory=list)  # hours
    files_before: int = 0
    files_after: int = 0
    vacuumed: int = 0  # files removed
    deleted_hours: list[str] = field(default_factory=list)
    conflicts: int = 0  # compactions a writer's commit overtook (tried next time)


def _files_by_hour(table: DeltaTable) -> Counter:
    actions = pa.table(table.get_add_actions(flatten=True)).to_pydict()
    return Counter(actions[f"partition.{HOUR}"])


def store_maintain(
    *, now: datetime | None = None, config: LogConfig | None = None, progress=None
) -> Maintenance:
    """One pass of upkeep over the store (see the module's docstring)."""
    config = config or LogConfig.from_settings()
    now = now or datetime.now(UTC)
    done = Maintenance()
    try:
        table = DeltaTable(config.store_url)
    except TableNotFoundError:
        return done
    cfg = settings.USAGE_LOG
    keep_months = cfg["STORE_RETENTION_MONTHS"]
    if keep_months:
        horizon = hour_key(months_add(now.replace(day=1, hour=0, minute=0), -keep_months))
        old = sorted(h for h in _files_by_hour(table) if h < horizon)
        if old:
            table.delete(f"{HOUR} < '{horizon}'")
            done.deleted_hours = old
    longest = timedelta(seconds=settings.METERING["MAX_REQUEST_SECONDS"])
    closed_before = hour_key(now - longest - GRACE)
    files = _files_by_hour(table)
    done.files_before = sum(files.values())
    due = sorted(h for h, n in files.items() if n > 1 and h < closed_before)
    for n, hour in enumerate(due):
        try:
            table.optimize.compact(
                partition_filters=[(HOUR, "=", hour)],
                target_size=TARGET_FILE_BYTES,
                writer_properties=WriterProperties(compression="ZSTD", compression_level=3),
            )
            done.compacted.append(hour)
        except CommitFailedError as exc:  # a writer's late commit to the hour won
            done.conflicts += 1
            logger.info("usage store: compacting %s deferred: %s", hour, exc)
            table.update_incremental()
        if progress is not None:
            progress(n + 1, len(due))
    table.create_checkpoint()
    table.cleanup_metadata()
    done.vacuumed = len(
        table.vacuum(
            retention_hours=cfg["STORE_VACUUM_HOURS"],
            dry_run=False,
            enforce_retention_duration=False,
        )
    )
    done.files_after = sum(_files_by_hour(table).values())
    logger.info(
        "usage store: %d hours compacted (%d files to %d), %d files vacuumed, %d hours deleted",
        len(done.compacted),
        done.files_before,
        done.files_after,
        done.vacuumed,
        len(done.deleted_hours),
    )
    return done
