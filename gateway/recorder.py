"""Recording never blocks the response path, and loses nothing it was
given: each record is appended to the gateway's durable spool
(gateway.spool) before anything else, and written from there to the sink
(metering's ledger, in a worker thread) in batches: every FLUSH_SECONDS,
or at once when FLUSH_MAX wait. A batch leaves the spool only once the
sink has committed it, so a database away for an hour only makes the
spool longer, and a process killed leaves its records for the next one
to replay (the ledger skips a request id it holds).

When the sink fails: a transient error (the database is away, or the
usage log: SinkUnavailable) keeps the batch for a retry. Any other error
is a bad record, not a bad database:
the batch is written record by record, and a record that still fails goes
to a dead-letter file (JSON lines) so one poison record never blocks the
rest and nothing disappears silently.

A full spool (its cap, or its disk): the pipeline asks `accepting()`
before it takes a request. Refusing (the default) answers 503
metering_unavailable until the spool has room again; serving anyway
(SPOOL_FULL=serve) holds the records in memory meanwhile, up to
MAX_BACKLOG, past which they are dropped and counted. Without a spool
(SPOOL_DIR empty) every record waits in memory the same way."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from core.outages import database_outage_report
from gateway.orm import orm
from gateway.spool import Spool, SpoolFull
from gateway.telemetry import (
    DEAD_LETTERED,
    DROPPED,
    FLUSH_SECONDS,
    FLUSHED,
    SPOOL_FULL_REQUESTS,
    SPOOL_REPLAYED,
    SPOOL_TORN,
)
from serving.records import CompletedRequest, RecordSink, SinkUnavailable, record_sink

logger = logging.getLogger(__name__)

FULL_CHOICES = ("refuse", "serve")


class Recorder:
    def __init__(
        self,
        sink: RecordSink,
        *,
        flush_seconds: float,
        flush_max: int,
        dead_letter_path: Path,
        spool: Spool | None = None,
        serve_when_full: bool = False,
        max_backlog: int = 200_000,
    ) -> None:
        self._dead_letter_path = dead_letter_path
        self.dead_lettered = 0
        self._sink = sink
        self._flush_seconds = flush_seconds
        self._flush_max = flush_max
        self._max_backlog = max_backlog
        self.spool = spool
        self._serve_when_full = serve_when_full
        self._full_since: float | None = None
        self._checkpoint_unwritten = False
        self._pending: list[CompletedRequest] = []  # in memory: no spool, or a full one
        self._wake = asyncio.Event()  # a full batch, or closing: flush now
        self._arrived = asyncio.Event()  # a record after none: the flush timer starts
        self._task: asyncio.Task | None = None
        self._closing = False
        self.flushed = 0
        self.dropped = 0
        self.replays_written = 0
        self.last_flush_seconds = 0.0
        self._writing = 0
        if spool is not None and spool.stats.torn:
            SPOOL_TORN.inc(spool.stats.torn)

    @classmethod
    def from_settings(cls, cfg: Mapping) -> Recorder:
        """Into the record sink the settings name (metering's ledger),
        through a spool under SPOOL_DIR (none when it is empty)."""
        if cfg["SPOOL_FULL"] not in FULL_CHOICES:
            raise ImproperlyConfigured(
                f"GATEWAY_SPOOL_FULL must be one of {', '.join(FULL_CHOICES)}, "
                f"not {cfg['SPOOL_FULL']!r}"
            )
        spool = None
        if cfg["SPOOL_DIR"]:
            spool = Spool.open(
                Path(cfg["SPOOL_DIR"]),
                cap_bytes=cfg["SPOOL_MAX_BYTES"],
                segment_bytes=cfg["SPOOL_SEGMENT_BYTES"],
                sync_seconds=cfg["SPOOL_SYNC_SECONDS"],
                sync_records=cfg["SPOOL_SYNC_RECORDS"],
            )
            if spool.stats.replayed:
                logger.warning(
                    "spool %s: %d records left by a process before this one, to replay",
                    spool.dir,
                    spool.stats.replayed,
                )
        return cls(
            record_sink(),
            flush_seconds=cfg["RECORD_FLUSH_SECONDS"],
            flush_max=cfg["RECORD_FLUSH_MAX"],
            dead_letter_path=Path(cfg["DEAD_LETTER_PATH"]),
            spool=spool,
            serve_when_full=cfg["SPOOL_FULL"] == "serve",
        )

    @property
    def backlog(self) -> int:
        """Records the sink does not hold yet: spooled, waiting in memory,
        or in the write under way."""
        spooled = self.spool.unacked if self.spool is not None else 0
        return len(self._pending) + self._writing + spooled

    def _unwritten(self) -> bool:
        return bool(self._pending) or (self.spool is not None and self.spool.unread > 0)

    # --- the event loop's side -----------------------------------------------
    def accepting(self) -> bool:
        """May the gateway take a request now: a record of it can be kept.
        False only with a full spool and SPOOL_FULL=refuse."""
        spool = self.spool
        if spool is None or not spool.full:
            return True
        if spool.room():
            self._room_again()
            return True
        self._filled()
        outcome = "served" if self._serve_when_full else "refused"
        SPOOL_FULL_REQUESTS.labels(outcome=outcome).inc()
        return self._serve_when_full

    def add(self, record: CompletedRequest) -> None:
        if self.spool is not None:
            try:
                self.spool.append(record.to_bytes(), keep=record)
            except SpoolFull:
                self._filled()
                self._keep_in_memory(record)
        else:
            self._keep_in_memory(record)
        self._arrived.set()
        if self.backlog >= self._flush_max:
            self._wake.set()

    def _keep_in_memory(self, record: CompletedRequest) -> None:
        self._pending.append(record)
        if len(self._pending) > self._max_backlog:
            overflow = len(self._pending) - self._max_backlog
            del self._pending[:overflow]
            self.dropped += overflow
            DROPPED.inc(overflow)
            logger.error("record backlog over %d: dropped %d records", self._max_backlog, overflow)

    def _filled(self) -> None:
        if self._full_since is not None:
            return
        self._full_since = time.monotonic()
        spool = self.spool
        if self._serve_when_full:
            then = (
                f"serving requests anyway, their records held in memory (at most "
                f"{self._max_backlog:,}, then dropped and counted): GATEWAY_SPOOL_FULL=serve"
            )
        else:
            then = "refusing new requests with 503 metering_unavailable: GATEWAY_SPOOL_FULL=refuse"
        logger.error(
            "spool %s is full (%s: %s bytes of a %s-byte cap); %s",
            spool.dir,
            spool.full_why,
            f"{spool.stats.bytes:,}",
            f"{spool.cap_bytes:,}",
            then,
        )

    def _room_again(self) -> None:
        if self._full_since is not None:
            logger.warning(
                "spool %s has room again after %.1f s full",
                self.spool.dir,
                time.monotonic() - self._full_since,
            )
            self._full_since = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="record-flusher")
        if self.spool is not None and self.spool.unread:
            self._arrived.set()  # what the process before left: replay it now

    async def close(self) -> None:
        """Flush everything (retrying a few times) and stop. What the sink
        could not take stays in the spool for the next process."""
        self._closing = True
        self._wake.set()
        self._arrived.set()
        if self._task is not None:
            await self._task
        for _attempt in range(5):
            while self._unwritten() and await self._flush():
                pass
            if not self._unwritten():
                break
            await asyncio.sleep(0.5)
        if self.spool is not None:
            for record in self._pending[:]:  # held in memory: into the spool if it has room now
                with contextlib.suppress(SpoolFull):
                    self.spool.append(record.to_bytes())
                    self._pending.remove(record)
            left = self.spool.unacked
            await asyncio.to_thread(self.spool.close)
            if left:
                logger.error(
                    "shutdown with %d records not in the ledger: kept in %s, "
                    "replayed by the next process to start",
                    left,
                    self.spool.dir,
                )
        if self._pending:
            logger.error("shutdown with %d unflushed records lost", len(self._pending))

    async def _run(self) -> None:
        """Flush FLUSH_SECONDS after the first record of a batch came (or at
        once when FLUSH_MAX wait); with nothing to write, sleep until a
        record comes rather than wake up ten times a second for nothing."""
        while not self._closing:
            if not self._unwritten():
                self._arrived.clear()
                await self._arrived.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._flush_seconds)
            self._wake.clear()
            # A backlog (an outage's, a replay's) goes out batch after batch.
            while self._unwritten() and not self._closing:
                if not await self._flush():
                    await asyncio.sleep(min(1.0, self._flush_seconds * 10))
                    break

    async def _flush(self) -> bool:
        started = time.perf_counter()
        if self._pending:
            batch, self._pending = self._pending, []
            written = len(batch)
            self._writing = written
            try:
                kept = await orm(self._write, batch=batch)
            except Exception:
                logger.exception("record sink failed; %d records kept for retry", len(batch))
                kept = batch
            finally:
                self._writing = 0
            if kept:
                self._pending[:0] = kept
                return False
        else:
            try:
                written = await orm(self._write_spooled)
            except Exception as exc:
                if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
                    # The batch is in the ledger, its checkpoint not written: read
                    # again, and skipped there by request id. The full disk is its
                    # own ERROR already (the spool's): one WARNING here until a
                    # checkpoint is written again, not a traceback per flush.
                    if not self._checkpoint_unwritten:
                        logger.warning(
                            "spool checkpoint not written (%s); its records are read again "
                            "and skipped by request id",
                            exc,
                        )
                    self._checkpoint_unwritten = True
                else:
                    logger.exception("record sink failed; the spool's batch is kept for retry")
                self.spool.rewind()
                written = None
            if written is None:
                return False
            self._checkpoint_unwritten = False
        self.flushed += written
        self.last_flush_seconds = time.perf_counter() - started
        FLUSH_SECONDS.observe(self.last_flush_seconds)
        FLUSHED.inc(written)
        return True

    # --- the worker thread's side --------------------------------------------
    def _write_spooled(self) -> int | None:
        """The spool's next batch written and acknowledged: how many
        records, or None when it must be tried again."""
        spool = self.spool
        batch = spool.read(self._flush_max)
        records = []
        for payload, kept in zip(batch.payloads, batch.kept, strict=True):
            if kept is not None:  # as it was added: nothing to decode
                records.append(kept)
                continue
            try:
                records.append(CompletedRequest.from_bytes(payload))
            except (ValueError, TypeError) as exc:
                self._dead_letter_raw(payload, exc)
        if self._write(records):
            spool.rewind()
            return None
        spool.ack(batch)
        replays = min(spool.stats.acked, spool.stats.replayed) - self.replays_written
        if replays > 0:
            self.replays_written += replays
            SPOOL_REPLAYED.inc(replays)
        return len(batch.payloads)

    def _write(self, batch: list[CompletedRequest]) -> list[CompletedRequest]:
        """Write `batch`; return the records to retry later."""
        from django.db import InterfaceError, OperationalError

        if not batch:
            return []
        transient = (OperationalError, InterfaceError, SinkUnavailable)
        try:
            self._sink(batch)
            return []
        except SinkUnavailable:
            return batch  # the sink has said so, once per outage
        except transient as exc:
            doing = f"gateway writing usage records ({len(batch)} kept for retry)"
            if not database_outage_report(exc, doing=doing, log=logger):
                logger.warning("record sink unavailable; %d records kept for retry", len(batch))
            return batch
        except Exception:
            logger.exception("record batch rejected; writing its %d records one by one", len(batch))
        retry = []
        for record in batch:
            try:
                self._sink([record])
            except transient:
                retry.append(record)
            except Exception as exc:
                self._dead_letter(record, exc)
        return retry

    def _dead_letter(self, record: CompletedRequest, exc: Exception) -> None:
        self._dead_letter_line({"error": str(exc)[:500], "record": record.as_dict()})
        logger.error(
            "record %s dead-lettered to %s: %s", record.request_id, self._dead_letter_path, exc
        )

    def _dead_letter_raw(self, payload: bytes, exc: Exception) -> None:
        """A spooled record that is no record (written by another version)."""
        raw = payload.decode("utf-8", "replace")
        self._dead_letter_line({"error": f"unreadable record: {exc}"[:500], "raw": raw})
        logger.error("an unreadable spooled record dead-lettered to %s", self._dead_letter_path)

    def _dead_letter_line(self, entry: dict) -> None:
        self._dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        with self._dead_letter_path.open("a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
        self.dead_lettered += 1
        DEAD_LETTERED.inc()
