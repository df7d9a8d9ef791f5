"""The raw-event store of the scaled path: a Delta Lake table (delta-rs)
of Parquet files (zstd), partitioned by the hour a request ended, under
USAGE_STORE_URL (a directory, or s3:// gs:// az:// with delta-rs's
storage options from the environment).

Why Delta Lake: its commit is the writers' exactly-once. Each commit
carries, per log partition it covers, an application transaction
(app id "<stream>/p<n>", version = the last stream sequence written), in
the same atomic step as the files; a writer taking a partition resumes
from the version the table holds, so a message is in the table once
whatever was killed when. Spark, Trino, DuckDB and pandas read the table
as it is; Iceberg would have needed a catalog service as well.

Columns: the ledger's own (metering.arrow_schema), then where each event
came from on the log (partition, stream sequence) and the `hour`
partition column ("2026-12-03T13")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime

import duckdb
import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, WriterProperties, write_deltalake
from deltalake.exceptions import TableNotFoundError

from metering.arrow_schema import ledger_fields
from metering.validation import LEDGER_COLUMNS

HOUR = "hour"
LOG_PARTITION, LOG_SEQ = "log_partition", "log_seq"
ENDED_AT = LEDGER_COLUMNS.index("ended_at")


def schema() -> pa.Schema:
    fields = ledger_fields()
    return pa.schema(
        [(name, fields[name]) for name in LEDGER_COLUMNS]
        + [
            ("ingested_at", fields["ingested_at"]),
            (LOG_PARTITION, pa.int32()),
            (LOG_SEQ, pa.int64()),
            (HOUR, pa.string()),
        ]
    )


def hour_key(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H")


def app_id(stream: str, partition: int) -> str:
    return f"{stream}/p{partition}"


def table(rows: Sequence[tuple], *, ingested_at: datetime) -> pa.Table:
    """Validated ledger rows (LEDGER_COLUMNS order, then log partition and
    sequence) as the store's Arrow table."""
    kinds = schema()
    columns = (
        list(zip(*rows, strict=True)) if rows else [() for _ in range(len(LEDGER_COLUMNS) + 2)]
    )
    n = len(LEDGER_COLUMNS)
    arrays = [pa.array(columns[i], type=kinds.field(i).type) for i in range(n)]
    arrays.append(pa.array([ingested_at] * len(rows), type=kinds.field(n).type))
    arrays.append(pa.array(columns[n], type=pa.int32()))
    arrays.append(pa.array(columns[n + 1], type=pa.int64()))
    arrays.append(pa.array([hour_key(row[ENDED_AT]) for row in rows], type=pa.string()))
    return pa.Table.from_arrays(arrays, schema=kinds)


class RawStore:
    def __init__(self, url: str, *, stream: str) -> None:
        self.url = url
        self.stream = stream

    def _table(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.url)
        except TableNotFoundError:
            return None

    def snapshot(self) -> DeltaTable | None:
        """The table as it is now (None: not made yet): read positions from
        it and commit to it, and a commit another writer made to the same
        partitions meanwhile makes this one fail (CommitFailedError: its
        application transactions conflict) instead of both landing."""
        return self._table()

    def positions(self, partitions: Iterable[int], *, snapshot=None) -> dict[int, int]:
        """The last stream sequence the table holds for each log partition (0: none)."""
        table_ = snapshot if snapshot is not None else self._table()
        found = {}
        for partition in partitions:
            version = table_.transaction_version(app_id(self.stream, partition)) if table_ else None
            found[partition] = version or 0
        return found

    def commit(self, data: pa.Table, positions: dict[int, int], *, snapshot=None) -> None:
        """The rows and the partitions' new positions, in one atomic commit
        (on `snapshot`, the table its positions were read from, when given)."""
        self.commit_versions(
            data,
            {app_id(self.stream, p): seq for p, seq in positions.items()},
            snapshot=snapshot,
        )

    def commit_versions(self, data: pa.Table, versions: dict[str, int], *, snapshot=None) -> None:
        """The rows and application transactions (app id -> version: how far
        whoever wrote them has got), in one atomic commit."""
        write_deltalake(
            snapshot if snapshot is not None else self.url,
            data,
            mode="append",
            partition_by=[HOUR],
            writer_properties=WriterProperties(compression="ZSTD", compression_level=3),
            commit_properties=CommitProperties(
                app_transactions=[
                    Transaction(app_id=app, version=version)
                    for app, version in sorted(versions.items())
                ]
            ),
        )

    def files(self, hours: Iterable[str] | None = None) -> list[str]:
        """The Parquet files of the table's current version (only those of
        `hours` when given: partition pruning)."""
        table_ = self._table()
        if table_ is None:
            return []
        if hours is None:
            return table_.file_uris()
        return table_.file_uris(partition_filters=[(HOUR, "in", sorted(set(hours)))])

    def events(self, hours: Iterable[str] | None = None, where=None) -> pa.Table:
        """The rows of `hours` (all with None) that meet `where` (a pyarrow
        expression), each (request id, phase) once: the one first on the
        log (a record published twice past the log's duplicate window is
        two rows in the table, one event)."""
        raw = self.read(hours, where=where)
        with duckdb.connect() as db:
            db.register("raw", raw)
            return db.sql(
                "SELECT * EXCLUDE (n) FROM (SELECT *, row_number() OVER "
                "(PARTITION BY request_id, phase ORDER BY log_seq) AS n FROM raw) WHERE n = 1"
            ).to_arrow_table()

    def latest(self, hours: Iterable[str], *, where, limit: int) -> pa.Table:
        """The `limit` rows of `hours` meeting `where` received last, each
        (request id, phase) once. A top-N in DuckDB over the hours' scan:
        however many rows the hours hold, only the last few are kept (a
        duplicate is an identical row, so the last 4 x `limit` hold `limit`
        distinct ones unless a quarter of them were published twice past
        the log's duplicate window)."""
        table_ = self._table()
        hours = sorted(set(hours))
        if table_ is None or not hours:
            return schema().empty_table()
        dataset = table_.to_pyarrow_dataset(file_pruning_predicate=[(HOUR, "in", hours)])
        with duckdb.connect() as db:
            db.register("raw", dataset.scanner(filter=where).to_reader())
            top = db.execute(
                "SELECT * FROM raw ORDER BY received_at DESC, log_seq LIMIT ?", [limit * 4]
            ).to_arrow_table()
            db.register("top", top)
            return db.execute(
                "SELECT * EXCLUDE (n) FROM (SELECT *, row_number() OVER "
                "(PARTITION BY request_id, phase ORDER BY log_seq) AS n FROM top) WHERE n = 1 "
                "ORDER BY received_at DESC LIMIT ?",
                [limit],
            ).to_arrow_table()

    def read(
        self, hours: Iterable[str] | None = None, columns: list[str] | None = None, where=None
    ) -> pa.Table:
        """The rows of `hours` (all with None) that meet `where`, as they
        were written (duplicates and all: see `events`); only the hours'
        partitions are opened."""
        table_ = self._table()
        if table_ is None:
            empty = schema().empty_table()
            return empty.select(columns) if columns else empty
        filters = [(HOUR, "in", sorted(set(hours)))] if hours is not None else None
        if hours is not None and not filters[0][2]:
            empty = schema().empty_table()
            return empty.select(columns) if columns else empty
        dataset = table_.to_pyarrow_dataset(file_pruning_predicate=filters)
        return dataset.to_table(columns=columns, filter=where)
