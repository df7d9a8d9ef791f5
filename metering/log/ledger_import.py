"""An existing deployment switched to the scaled path (`manage.py
usage_store import-ledger`): the raw rows its PostgreSQL ledger holds
copied into the store, so that the hour jobs, which read only the store,
see the usage recorded before the switch as well (late usage to an old
hour rebuilds it from the store: without them that hour would lose them).

An hour at a time, by the hour requests were received (the ledger's order:
its BRIN index), in order, each hour one commit that also records the hour
done (an application transaction, "<stream>/ledger"; rows land in the
partitions of the hours they ended in): stopped at any point, run again,
it goes on after the last hour committed and never copies an hour twice.
An hour's rows are held in memory while it is written. Imported rows come
first in the store's order of a (request id, phase) (log partition -1,
sequence 0): should the same request reach the log as well, the ledger's
row is the one read.

Rows of the last RECENT_HOURS hours are marked pending (their windows and
hours, as new usage is): whatever the hour jobs computed from the store
while the import was under way is computed again with them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from django.db import connection, transaction
from django.db.models import Max, Min

from metering.ledger import usage_mark_stale
from metering.log.store import RawStore, table
from metering.log.stream import LogConfig
from metering.models import UsageEvent
from metering.validation import LEDGER_COLUMNS

RECENT_HOURS = 48
IMPORTED_PARTITION = -1


@dataclass
class LedgerImport:
    hours: int = 0  # hours committed by this run
    events: int = 0
    resumed_after: datetime | None = None  # the last hour a previous run committed


def _app_id(stream: str) -> str:
    return f"{stream}/ledger"


def ledger_import(
    *,
    until: datetime | None = None,
    config: LogConfig | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> LedgerImport:
    """The ledger's rows of every hour before `until` (now's hour by
    default) not imported yet, into the store."""
    config = config or LogConfig.from_settings()
    store = RawStore(config.store_url, stream=config.stream)
    done = LedgerImport()
    span = UsageEvent.objects.aggregate(first=Min("received_at"), last=Max("received_at"))
    if span["first"] is None:
        return done
    until = _hour(until or datetime.now(UTC))
    snapshot = store.snapshot()
    last_done = snapshot.transaction_version(_app_id(config.stream)) if snapshot else None
    hour = _hour(span["first"])
    if last_done is not None:
        done.resumed_after = datetime.fromtimestamp(last_done * 3600, tz=UTC)
        hour = max(hour, done.resumed_after + timedelta(hours=1))
    end = min(until, _hour(span["last"]) + timedelta(hours=1))
    total = max(0, int((end - hour).total_seconds()) // 3600)
    recent = until - timedelta(hours=RECENT_HOURS)
    for n in range(total):
        rows = list(
            UsageEvent.objects.filter(
                received_at__gte=hour, received_at__lt=hour + timedelta(hours=1)
            )
            .order_by("request_id", "phase")
            .values_list(*LEDGER_COLUMNS, "ingested_at")
            .iterator(chunk_size=5000)
        )
        # An hour without usage is committed only as the last: where to resume.
        if rows or n == total - 1:
            _commit(store, config.stream, rows, hour)
        if rows and hour >= recent:
            with transaction.atomic(), connection.cursor() as cursor:
                usage_mark_stale(cursor.cursor, [row[:-1] for row in rows])
        done.hours += 1
        done.events += len(rows)
        if progress is not None:
            progress(n + 1, total)
        hour += timedelta(hours=1)
    return done


def _commit(store: RawStore, stream: str, rows: list[tuple], hour: datetime) -> None:
    """One hour's rows, and the hour done, in one commit."""
    ingested = pa.array([row[-1] for row in rows], pa.timestamp("us", "UTC"))
    data = table(
        [(*row[:-1], IMPORTED_PARTITION, 0) for row in rows], ingested_at=datetime.now(UTC)
    )
    data = data.set_column(data.schema.get_field_index("ingested_at"), "ingested_at", ingested)
    store.commit_versions(data, {_app_id(stream): int(hour.timestamp()) // 3600})


def _hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
