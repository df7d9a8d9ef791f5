"""The audit trail keeps the ledger's retention rule (metering.retention):
a month wholly before the horizon is written to a Parquet file beside the
ledger's archives (METERING_ARCHIVE_URL/audit/), read back and verified
(bytes, rows, entry ids), recorded, and only then removed, with the
trail's own function (audit_retire, audit.triggers) the one way to remove
an entry. A run cut short removes nothing it has not verified; run again,
it goes on. Links of the hash chain stay (audit.chain)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, date, datetime

import pyarrow as pa
import pyarrow.parquet as pq
from django.conf import settings
from django.db import connection, transaction
from django.db.models.functions import TruncMonth

from audit.models import AuditArchive, AuditEntry
from core.calendar import months_add
from core.locks import advisory_lock
from metering.archive import archive_digest, archive_location, archive_open
from metering.retention import horizon_start

logger = logging.getLogger(__name__)
LOCK = "audit.archive"
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("at", pa.timestamp("us", "UTC")),
        ("table", pa.string()),
        ("row_id", pa.string()),
        ("action", pa.string()),
        ("changed", pa.list_(pa.string())),
        ("before", pa.string()),  # JSON
        ("after", pa.string()),  # JSON
        ("tenant_id", pa.int64()),
        ("actor", pa.string()),
        ("actor_user_id", pa.int64()),
        ("via", pa.string()),
        ("request", pa.string()),
        ("transaction_id", pa.int64()),
    ]
)


class AuditArchiveMismatch(Exception):
    """The file read back is not what was written: nothing removed."""


def audit_archive_due(*, now: datetime) -> list[date]:
    horizon = horizon_start(now)
    months = (
        AuditEntry.objects.filter(at__lt=horizon)
        .annotate(month=TruncMonth("at"))
        .values_list("month", flat=True)
        .distinct()
    )
    return sorted(m.date() for m in months)


def audit_archive(*, now: datetime, base_url: str | None = None) -> list[AuditArchive]:
    """Archive and remove every month of entries past the horizon."""
    with advisory_lock(LOCK):
        return [audit_month_archive(month=m, base_url=base_url) for m in audit_archive_due(now=now)]


def audit_month_archive(*, month: date, base_url: str | None = None) -> AuditArchive:
    start = datetime(month.year, month.month, 1, tzinfo=UTC)
    end = months_add(start, 1)
    base_url = f"{(base_url or settings.METERING['ARCHIVE_URL']).rstrip('/')}/audit"
    name = f"audit-{start:%Y-%m}.parquet"
    with transaction.atomic():
        entries = AuditEntry.objects.filter(at__gte=start, at__lt=end).order_by("id")
        rows = [_row(e) for e in entries]
        filesystem, path, url = archive_location(base_url, name)
        table = pa.Table.from_pylist(rows, schema=SCHEMA)
        with filesystem.open_output_stream(path) as sink:
            pq.write_table(table, sink, compression="zstd")
        ids = [r["id"] for r in rows]
        sha256 = _verify(url, ids)
        with connection.cursor() as cursor:  # the trail's own function: recorded, then removed
            cursor.execute(
                "SELECT audit_retire(%s, %s, %s, %s, %s, %s)",
                [start.date(), url, sha256, ids[0], ids[-1], len(ids)],
            )
        archive = AuditArchive.objects.get(month=start.date())
    logger.info("audit month %s archived to %s (%d entries)", f"{start:%Y-%m}", url, len(rows))
    return archive


def _row(entry: AuditEntry) -> dict:
    return {
        **{f: getattr(entry, f) for f in SCHEMA.names if f not in {"before", "after"}},
        "before": None if entry.before is None else json.dumps(entry.before, sort_keys=True),
        "after": None if entry.after is None else json.dumps(entry.after, sort_keys=True),
    }


def _verify(url: str, ids: list[int]) -> str:
    """The file's SHA-256, once its rows read back are `ids`."""
    sha256, _ = archive_digest(url)
    filesystem, path = archive_open(url)
    with filesystem.open_input_file(path) as handle:
        found = pq.read_table(handle, columns=["id"])["id"].to_pylist()
    if found != ids:
        raise AuditArchiveMismatch(f"{url} holds {len(found)} entries, not the {len(ids)} written")
    return sha256
