"""Recording never blocks the response path: records go to an in-memory
buffer, flushed to the sink (in a worker thread) every FLUSH_SECONDS or when
FLUSH_MAX records wait, and once more on graceful shutdown.

When the sink fails: a transient error (the database is away) keeps the
batch for a retry. Any other error is a bad record, not a bad database: the
batch is written record by record, and a record that still fails goes to a
dead-letter file (JSON lines) so one poison record never blocks the rest and
nothing disappears silently. Only a backlog over MAX_BACKLOG drops records,
and that is logged loudly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path

from gateway.orm import orm
from gateway.telemetry import DEAD_LETTERED, FLUSH_SECONDS, FLUSHED
from serving.records import CompletedRequest, RecordSink, record_sink

logger = logging.getLogger(__name__)


class Recorder:
    def __init__(
        self,
        sink: RecordSink,
        *,
        flush_seconds: float,
        flush_max: int,
        dead_letter_path: Path,
        max_backlog: int = 200_000,
    ) -> None:
        self._dead_letter_path = dead_letter_path
        self.dead_lettered = 0
        self._sink = sink
        self._flush_seconds = flush_seconds
        self._flush_max = flush_max
        self._max_backlog = max_backlog
        self._pending: list[CompletedRequest] = []
        self._wake = asyncio.Event()  # a full batch, or closing: flush now
        self._arrived = asyncio.Event()  # a record after none: the flush timer starts
        self._task: asyncio.Task | None = None
        self._closing = False
        self.flushed = 0
        self.dropped = 0
        self.last_flush_seconds = 0.0
        self._writing = 0

    @classmethod
    def from_settings(cls, cfg: Mapping) -> Recorder:
        """Into the record sink the settings name (metering's ledger)."""
        return cls(
            record_sink(),
            flush_seconds=cfg["RECORD_FLUSH_SECONDS"],
            flush_max=cfg["RECORD_FLUSH_MAX"],
            dead_letter_path=Path(cfg["DEAD_LETTER_PATH"]),
        )

    @property
    def backlog(self) -> int:
        """Records not yet durable: waiting, or in the write under way."""
        return len(self._pending) + self._writing

    def add(self, record: CompletedRequest) -> None:
        self._pending.append(record)
        if len(self._pending) == 1:
            self._arrived.set()
        if len(self._pending) >= self._flush_max:
            self._wake.set()
        if len(self._pending) > self._max_backlog:
            overflow = len(self._pending) - self._max_backlog
            del self._pending[:overflow]
            self.dropped += overflow
            logger.error("record backlog over %d: dropped %d records", self._max_backlog, overflow)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="record-flusher")

    async def close(self) -> None:
        """Flush everything (retrying a few times) and stop."""
        self._closing = True
        self._wake.set()
        self._arrived.set()
        if self._task is not None:
            await self._task
        for _attempt in range(5):
            if not self._pending or await self._flush():
                break
            await asyncio.sleep(0.5)
        if self._pending:
            logger.error("shutdown with %d unflushed records", len(self._pending))

    async def _run(self) -> None:
        """Flush FLUSH_SECONDS after the first record of a batch came (or at
        once when FLUSH_MAX wait); with nothing to write, sleep until a
        record comes rather than wake up ten times a second for nothing."""
        while not self._closing:
            if not self._pending:
                self._arrived.clear()
                await self._arrived.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=self._flush_seconds)
            self._wake.clear()
            if self._pending and not await self._flush():
                await asyncio.sleep(min(1.0, self._flush_seconds * 10))

    async def _flush(self) -> bool:
        batch, self._pending = self._pending, []
        started = time.perf_counter()
        self._writing = len(batch)
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
        self.flushed += len(batch)
        self.last_flush_seconds = time.perf_counter() - started
        FLUSH_SECONDS.observe(self.last_flush_seconds)
        FLUSHED.inc(len(batch))
        return True

    def _write(self, batch: list[CompletedRequest]) -> list[CompletedRequest]:
        """Write `batch`; return the records to retry later."""
        from django.db import InterfaceError, OperationalError

        transient = (OperationalError, InterfaceError)
        try:
            self._sink(batch)
            return []
        except transient:
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
        self._dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"error": str(exc)[:500], "record": record.as_dict()}, default=str)
        with self._dead_letter_path.open("a") as fh:
            fh.write(line + "\n")
        self.dead_lettered += 1
        DEAD_LETTERED.inc()
        logger.error(
            "record %s dead-lettered to %s: %s", record.request_id, self._dead_letter_path, exc
        )
