"""Archiving the raw ledger's months past the retention horizon
(metering.retention), in this order, each step recorded on the month's
UsageArchive row so a run cut short goes on where it stopped:

1. export: the month's partition, in one snapshot, to a Parquet file
   (zstd) under METERING_ARCHIVE_URL, streamed (PostgreSQL's CSV COPY
   parsed by Arrow), with the snapshot's row count and token sums and the
   file's SHA-256 recorded;
2. verify: the file read back, its bytes hashed again and its rows and
   token sums recomputed; any difference stops here, nothing dropped;
3. prune: the archived events' idempotency keys deleted, a slice of the
   partition at a time (short transactions: writers never wait on them);
4. drop: the partition locked against writes, counted once more against
   the archive, detached and dropped, in one transaction.

Rollups, invoices and these rows are kept forever.

Where the files go: METERING_ARCHIVE_URL, a directory or any URL
pyarrow.fs opens (s3://bucket/prefix takes AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_REGION, and AWS_ENDPOINT_URL for an
S3-compatible store; gs://bucket/prefix takes Google's credentials)."""

from __future__ import annotations

import hashlib
import io
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from django.conf import settings
from django.db import connection, models, transaction
from django.utils import timezone
from psycopg import sql

from core.calendar import month_start, months_add
from core.locks import advisory_lock, advisory_xact_lock
from metering.arrow_schema import arrow_type
from metering.models import UsageArchive, UsageEvent
from metering.partitions import LEDGER_TABLE, partition_name, usage_partitions_list
from metering.retention import horizon_start

logger = logging.getLogger(__name__)

ARCHIVE_LOCK = "metering.archive"  # one archiver at a time
TOKENS = ("prompt_tokens", "cached_tokens", "completion_tokens")
PRUNE_PAGES = 2000  # of the partition per key-pruning transaction
DROP_LOCK_TIMEOUT = "10s"  # for the drop's lock on the ledger; then it fails, to run again
Progress = Callable[[str, int, int], None]  # (step, done, total)


class ArchiveMismatch(Exception):
    """The file, or the partition, is not what the archive recorded: nothing is dropped."""


@dataclass(frozen=True)
class _Column:
    name: str
    select: sql.Composable  # how COPY writes it
    csv_type: pa.DataType  # how Arrow reads that
    arrow_type: pa.DataType  # what the Parquet file holds


def _columns() -> list[_Column]:
    """Every column of the ledger, typed from the model."""
    columns = []
    for field in UsageEvent._meta.concrete_fields:
        name = sql.Identifier(field.column)
        kind = arrow_type(field)
        if isinstance(field, models.DateTimeField):  # exact: integer microseconds
            select = sql.SQL("(extract(epoch FROM {}) * 1000000)::bigint").format(name)
            columns.append(_Column(field.column, select, pa.int64(), kind))
        else:
            columns.append(_Column(field.column, name, kind, kind))
    return columns


def archive_due(*, now: datetime) -> list[datetime]:
    """The months whose partition lies wholly before the horizon, oldest first."""
    horizon = horizon_start(now)
    months = []
    for name in usage_partitions_list():
        month = _partition_month(name)
        if month is not None and months_add(month, 1) <= horizon:
            months.append(month)
    return sorted(months)


def _partition_month(name: str) -> datetime | None:
    prefix = f"{LEDGER_TABLE}_y"
    if not name.startswith(prefix):
        return None
    year, month = name[len(prefix) :].split("m")
    return datetime(int(year), int(month), 1, tzinfo=UTC)


def ledger_archive(
    *, now: datetime, base_url: str | None = None, progress: Progress | None = None
) -> list[UsageArchive]:
    """Archive and drop every month due; returns their archives."""
    return [
        month_archive(month=month, base_url=base_url, progress=progress)
        for month in archive_due(now=now)
    ]


def month_archive(
    *, month: datetime, base_url: str | None = None, progress: Progress | None = None
) -> UsageArchive:
    """One month through the four steps (those not done before)."""
    month = month_start(month)
    base_url = base_url or settings.METERING["ARCHIVE_URL"]
    with advisory_lock(ARCHIVE_LOCK):
        archive = UsageArchive.objects.filter(month=month).first()
        if archive is not None and archive.dropped_at is not None:
            return archive
        if archive is None or archive.verified_at is None:
            archive = _export(month, base_url, progress)
            _verify(archive)
        _prune_keys(archive, progress)
        try:
            _drop(archive)
        except ArchiveMismatch:  # the file is not the whole month: the next run exports again
            UsageArchive.objects.filter(pk=archive.pk).update(verified_at=None)
            raise
        logger.info("ledger month %s archived to %s and dropped", f"{month:%Y-%m}", archive.url)
        return archive


def _location(base_url: str, month: datetime) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, its path, the URL recorded) of `month`'s file."""
    return archive_location(base_url, f"{LEDGER_TABLE}-{month:%Y-%m}.parquet")


def archive_location(base_url: str, name: str) -> tuple[pafs.FileSystem, str, str]:
    """(filesystem, its path, the URL recorded) of the archive file `name`
    under `base_url` (a directory or a URL pyarrow.fs opens)."""
    filesystem, base = pafs.FileSystem.from_uri(_as_uri(base_url))
    filesystem.create_dir(base, recursive=True)
    return filesystem, f"{base.rstrip('/')}/{name}", f"{base_url.rstrip('/')}/{name}"


def archive_open(url: str) -> tuple[pafs.FileSystem, str]:
    """(filesystem, path) of an archive file recorded by its URL."""
    return pafs.FileSystem.from_uri(_as_uri(url))


def archive_digest(url: str) -> tuple[str, int]:
    """(SHA-256, bytes) of an archive file, read back in 8 MiB pieces."""
    filesystem, path = archive_open(url)
    digest, size = hashlib.sha256(), 0
    with filesystem.open_input_stream(path) as stream:
        while chunk := stream.read(8 << 20):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _as_uri(base_url: str) -> str:
    return base_url if "://" in base_url else f"file://{os.path.abspath(base_url)}"


def _export(month: datetime, base_url: str, progress: Progress | None) -> UsageArchive:
    partition = partition_name(month)
    filesystem, path, url = _location(base_url, month)
    columns = _columns()
    partial = f"{path}.partial"
    with transaction.atomic(), connection.cursor() as cursor:
        raw = cursor.cursor
        # One snapshot: the numbers recorded are those of the rows written.
        raw.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        counted = _counted(raw, partition)
        rows = counted[0]
        query = sql.SQL("COPY (SELECT {} FROM {}) TO STDOUT (FORMAT csv)").format(
            sql.SQL(", ").join(c.select for c in columns), sql.Identifier(partition)
        )
        schema = pa.schema([(c.name, c.arrow_type) for c in columns])
        digest = hashlib.sha256()
        written = 0
        with (
            filesystem.open_output_stream(partial) as sink,
            raw.copy(query) as copy,
        ):
            hashed = _Hashing(sink, digest)
            reader = pacsv.open_csv(
                io.BufferedReader(_CopyReader(copy), buffer_size=1 << 20),
                read_options=pacsv.ReadOptions(
                    column_names=[c.name for c in columns], block_size=8 << 20
                ),
                convert_options=pacsv.ConvertOptions(
                    column_types={c.name: c.csv_type for c in columns},
                    null_values=[""],
                    strings_can_be_null=True,
                    quoted_strings_can_be_null=False,
                    true_values=["t"],
                    false_values=["f"],
                ),
            )
            with pq.ParquetWriter(hashed, schema, compression="zstd") as writer:
                for batch in reader:
                    writer.write_batch(_typed(batch, schema))
                    written += batch.num_rows
                    if progress:
                        progress("exported", written, rows)
    if written != rows:
        raise ArchiveMismatch(f"{partition}: {written} rows exported of the snapshot's {rows}")
    filesystem.move(partial, path)
    archive, _ = UsageArchive.objects.update_or_create(
        month=month,
        defaults={
            "partition": partition,
            "url": url,
            "rows": rows,
            **dict(zip(TOKENS, counted[1:], strict=True)),
            "bytes": hashed.bytes,
            "sha256": digest.hexdigest(),
            "exported_at": timezone.now(),
            "verified_at": None,
        },
    )
    return archive


def _counted(raw, partition: str) -> tuple[int, int, int, int]:
    """(rows, prompt, cached, completion tokens) of the partition."""
    sums = sql.SQL(", ").join(
        sql.SQL("coalesce(sum({}), 0)").format(sql.Identifier(t)) for t in TOKENS
    )
    raw.execute(sql.SQL("SELECT count(*), {} FROM {}").format(sums, sql.Identifier(partition)))
    return tuple(int(v) for v in raw.fetchone())


def _typed(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [column.cast(field.type) for column, field in zip(batch.columns, schema, strict=True)],
        schema=schema,
    )


def _verify(archive: UsageArchive) -> None:
    """Read the file back: its bytes, rows and token sums are the archive's."""
    filesystem, path = archive_open(archive.url)
    sha256, size = archive_digest(archive.url)
    sums = dict.fromkeys(TOKENS, 0)
    with filesystem.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        rows = parquet.metadata.num_rows
        for group in range(parquet.num_row_groups):
            table = parquet.read_row_group(group, columns=list(TOKENS))
            for token in TOKENS:
                sums[token] += pc.sum(table[token]).as_py() or 0
    found = (size, sha256, rows, *sums.values())
    recorded = (archive.bytes, archive.sha256, archive.rows, *(getattr(archive, t) for t in TOKENS))
    if found != recorded:
        raise ArchiveMismatch(
            f"{archive.url} read back as (bytes, sha256, rows, tokens) {found}, "
            f"not the {recorded} recorded: nothing dropped"
        )
    archive.verified_at = timezone.now()
    archive.save(update_fields=["verified_at"])


def _prune_keys(archive: UsageArchive, progress: Progress | None) -> None:
    """The archived events' keys, a slice of the partition's pages at a time."""
    partition = sql.Identifier(archive.partition)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_relation_size(%s) / current_setting('block_size')::int",
            [archive.partition],
        )
        pages = cursor.fetchone()[0]
    for first in range(0, pages, PRUNE_PAGES):
        last = first + PRUNE_PAGES
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                sql.SQL(
                    "DELETE FROM metering_usagekey k USING {} e "
                    "WHERE e.ctid >= %s::tid AND e.ctid < %s::tid "
                    "AND k.request_id = e.request_id AND k.phase = e.phase"
                ).format(partition),
                [f"({first},0)", f"({last},0)"],
            )
            pruned = cursor.rowcount
        UsageArchive.objects.filter(pk=archive.pk).update(
            keys_pruned=models.F("keys_pruned") + pruned
        )
        if progress:
            progress("keys pruned", min(last, pages), pages)
    archive.refresh_from_db(fields=["keys_pruned"])


def _drop(archive: UsageArchive) -> None:
    """Counted once more under a lock that keeps writers out of it, then
    detached and dropped with the archive's row marked, all at once."""
    partition = sql.Identifier(archive.partition)
    with (
        transaction.atomic(),
        advisory_xact_lock(LEDGER_TABLE),  # partitions are made under it
        connection.cursor() as cursor,
    ):
        raw = cursor.cursor
        raw.execute(f"SET LOCAL lock_timeout = '{DROP_LOCK_TIMEOUT}'")
        raw.execute(sql.SQL("LOCK TABLE {} IN SHARE MODE").format(partition))
        counted = _counted(raw, archive.partition)
        recorded = (archive.rows, *(getattr(archive, t) for t in TOKENS))
        if counted != recorded:
            raise ArchiveMismatch(
                f"{archive.partition} holds (rows, tokens) {counted} now, not the {recorded} "
                "archived: usage arrived after the export; run the archive again"
            )
        raw.execute(
            sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(
                sql.Identifier(LEDGER_TABLE), partition
            )
        )
        raw.execute(sql.SQL("DROP TABLE {}").format(partition))
        archive.dropped_at = timezone.now()
        archive.save(update_fields=["dropped_at"])


class _CopyReader(io.RawIOBase):
    """A COPY TO STDOUT as a file Arrow reads from."""

    def __init__(self, copy) -> None:
        self._rows = iter(copy)
        self._left = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if not self._left:
            chunks, size = [], 0
            for chunk in self._rows:
                chunks.append(chunk)
                size += len(chunk)
                if size >= len(buffer):
                    break
            if not chunks:
                return 0
            self._left = memoryview(b"".join(chunks))
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class _Hashing(io.RawIOBase):
    """A write stream that hashes and counts what passes through."""

    def __init__(self, sink, digest) -> None:
        self._sink, self._digest = sink, digest
        self.bytes = 0

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._digest.update(data)
        self._sink.write(data)
        self.bytes += len(data)
        return len(data)
