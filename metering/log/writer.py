"""A ledger writer of the scaled path (`manage.py usage_writer`): run as
many as the load needs; together they take every partition of the usage
log into the raw-event store, each partition in one writer's hands.

Leases. The writers share a JetStream key-value bucket: a key per writer
(`w.<id>`, its heartbeat) and a key per partition (`p.<n>`, its holder),
every key gone `lease_seconds` after it was last written (the bucket's
TTL). A writer aims to hold its share (partitions / live writers, rounded
up), claims free partitions with a compare-and-set create, renews what it
holds with a compare-and-set update, and lets go of any over its share
once what it read of them is committed. A renewal refused means another
writer took the partition: what was read of it and not committed is
dropped (the other writer reads it again from the table's position).

Reading. Each partition held is read by an ephemeral pull consumer
starting just after the position the table holds for it (its Delta
application transaction), so nothing of the consumer's own state needs to
survive: a writer killed, a node lost, a consumer gone, and the next
reader starts from what was committed.

Committing. Every COMMIT_SECONDS (or COMMIT_EVENTS), the events read are
validated as the ledger validates them (an event that fails goes to the
dead-letter file, naming its field), and written with each partition's
new position in one Delta commit. Before committing, a partition whose
lease was not renewed within half its length, or whose position in the
table moved under us, is left out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import nats
from deltalake.exceptions import CommitFailedError
from django.db import close_old_connections, connection, transaction
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError, NoKeysError

from core.outages import OutageEpisode
from metering.choices import EventSource
from metering.ledger import usage_stale_mark, usage_stale_of
from metering.log.messages import MessageInvalid, events, subject
from metering.log.store import RawStore, table
from metering.log.stream import LogConfig, connect, leases_bucket, stream_ensure
from metering.validation import LEDGER_COLUMNS, EventInvalid, EventValidator

logger = logging.getLogger(__name__)

FETCH_BATCH = 64  # messages per pull (each a gateway flush: up to hundreds of events)
FETCH_WAIT = 0.5
PHASE = LEDGER_COLUMNS.index("phase")
USAGE_LOG = OutageEpisode("usage log")


@dataclass
class _Partition:
    number: int
    revision: int  # of its lease key
    renewed: float  # ok-float: monotonic seconds; monotonic
    committed: int  # the table's position
    read_to: int  # the last sequence read (committed or buffered)
    subscription: object | None = None
    delivered: int = 0  # the subscription's last consumer sequence
    events: list[tuple[dict, int]] = field(default_factory=list)  # (event, stream seq)
    releasing: bool = False


@dataclass
class WriterStats:
    messages: int = 0
    events: int = 0  # written
    invalid: int = 0  # dead-lettered
    duplicates: int = 0  # a (request id, phase) twice in one commit
    gaps: int = 0  # deliveries missed (a consumer made again from what was read)
    commits: int = 0
    lost: int = 0  # partitions taken by another writer


class Writer:
    def __init__(
        self,
        config: LogConfig,
        *,
        writer_id: str | None = None,
        alive_file: Path | None = None,
    ) -> None:
        self.config = config
        self.id = writer_id or f"{socket.gethostname()}-{os.getpid()}"
        self.store = RawStore(config.store_url, stream=config.stream)
        self.dead_letter_path = Path(config.dead_letter_dir) / f"{self.id}.jsonl"
        self.alive_file = alive_file  # touched each pass of the loop (a liveness probe's)
        self.held: dict[int, _Partition] = {}
        self.stats = WriterStats()
        self._js = None
        self._kv = None
        self._heartbeat_rev: int | None = None
        self._last_commit = time.monotonic()

    # --- the loop ---------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        nc = await connect(self.config, name=f"usage-writer {self.id}")
        try:
            self._js = nc.jetstream(timeout=5)
            await stream_ensure(self._js, self.config)
            self._kv = await leases_bucket(self._js, self.config)
            next_lease = 0.0
            while not stop.is_set():
                if time.monotonic() >= next_lease:
                    await self._leases()
                    next_lease = time.monotonic() + self.config.lease_seconds / 4
                await self._read()
                if self._commit_due():
                    await self._commit()
                if self.alive_file is not None:
                    self.alive_file.touch()
            await self._commit()
            await self._release_all()
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    def _commit_due(self) -> bool:
        waiting = sum(len(p.events) for p in self.held.values())
        released = any(p.releasing for p in self.held.values())
        return (
            waiting >= self.config.commit_events
            or released
            or (waiting and time.monotonic() - self._last_commit >= self.config.commit_seconds)
        )

    # --- leases -----------------------------------------------------------------
    async def _leases(self) -> None:
        try:
            await self._heartbeat()
            writers = await self._live_writers()
            share = -(-self.config.partitions // max(1, writers))
            for partition in list(self.held.values()):
                await self._renew(partition)
            holders = await self._holders()
            for n in range(self.config.partitions):
                if len(self.held) >= share:
                    break
                if n not in self.held and n not in holders:
                    await self._claim(n)
            over = len(self.held) - share
            for partition in sorted(self.held.values(), key=lambda p: -p.number):
                if over <= 0:
                    break
                partition.releasing = True
                over -= 1
            USAGE_LOG.recovered(log=logger)
        except (TimeoutError, nats.errors.Error) as exc:
            USAGE_LOG.failed(exc, doing=f"usage writer {self.id} renewing its leases", log=logger)

    async def _heartbeat(self) -> None:
        key = f"w.{self.id}"
        value = self.id.encode()
        try:
            self._heartbeat_rev = (
                await self._kv.update(key, value, last=self._heartbeat_rev)
                if self._heartbeat_rev
                else await self._kv.put(key, value)
            )
        except KeyWrongLastSequenceError:
            self._heartbeat_rev = await self._kv.put(key, value)

    async def _live_writers(self) -> int:
        try:
            return sum(1 for key in await self._kv.keys() if key.startswith("w."))
        except NoKeysError:
            return 1

    async def _holders(self) -> set[int]:
        try:
            keys = await self._kv.keys()
        except NoKeysError:
            return set()
        return {int(key[2:]) for key in keys if key.startswith("p.")}

    async def _claim(self, n: int) -> None:
        try:
            revision = await self._kv.create(f"p.{n}", self.id.encode())
        except KeyWrongLastSequenceError:
            return  # another writer got there first
        committed = (await asyncio.to_thread(self.store.positions, [n]))[n]
        self.held[n] = _Partition(n, revision, time.monotonic(), committed, committed)
        logger.info("usage writer %s: took partition %d from sequence %d", self.id, n, committed)

    async def _renew(self, partition: _Partition) -> None:
        try:
            partition.revision = await self._kv.update(
                f"p.{partition.number}", self.id.encode(), last=partition.revision
            )
            partition.renewed = time.monotonic()
        except (KeyWrongLastSequenceError, KeyNotFoundError):
            self._lose(partition, "its lease was taken by another writer")

    def _lose(self, partition: _Partition, why: str) -> None:
        self.held.pop(partition.number, None)
        self.stats.lost += 1
        logger.warning(
            "usage writer %s: partition %d dropped (%s): %d events read, not committed, "
            "are read again by its next holder",
            self.id,
            partition.number,
            why,
            len(partition.events),
        )
        self._unsubscribe(partition)

    async def _release(self, partition: _Partition) -> None:
        self.held.pop(partition.number, None)
        self._unsubscribe(partition)
        with contextlib.suppress(nats.errors.Error):
            await self._kv.delete(f"p.{partition.number}", last=partition.revision)
        logger.info("usage writer %s: let go of partition %d", self.id, partition.number)

    async def _release_all(self) -> None:
        for partition in list(self.held.values()):
            await self._release(partition)
        with contextlib.suppress(nats.errors.Error):
            await self._kv.delete(f"w.{self.id}")

    def _unsubscribe(self, partition: _Partition) -> None:
        partition.delivered = 0  # a new consumer numbers from 1
        if partition.subscription is not None:
            subscription, partition.subscription = partition.subscription, None
            task = asyncio.ensure_future(subscription.unsubscribe())
            task.add_done_callback(lambda t: t.exception())  # a consumer already gone

    # --- reading ----------------------------------------------------------------
    async def _read(self) -> None:
        reading = [p for p in self.held.values() if not p.releasing]
        if not reading:
            await asyncio.sleep(FETCH_WAIT)
            return
        await asyncio.gather(*(self._fetch(p) for p in reading))

    async def _fetch(self, partition: _Partition) -> None:
        try:
            if partition.subscription is None:
                partition.subscription = await self._js.pull_subscribe(
                    subject(partition.number),
                    durable=None,
                    stream=self.config.stream,
                    config=ConsumerConfig(
                        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                        opt_start_seq=partition.read_to + 1,
                        ack_policy=AckPolicy.NONE,
                        inactive_threshold=30.0,
                    ),
                )
            found = await partition.subscription.fetch(FETCH_BATCH, timeout=FETCH_WAIT)
        except (nats.errors.TimeoutError, TimeoutError):
            return  # nothing new in FETCH_WAIT
        except nats.errors.Error as exc:
            # The consumer's node gone, or the stream electing a leader: a new
            # consumer from what was read, next time round.
            logger.info("usage writer %s: partition %d: %s", self.id, partition.number, exc)
            self._unsubscribe(partition)
            await asyncio.sleep(FETCH_WAIT)
            return
        for message in found:
            # The consumer numbers what it delivers 1, 2, 3...: one missed (a
            # pull answered after its wait ran out, a consumer made again on
            # a new leader) is read again, by a new consumer from the last
            # stream sequence read, never stepped over.
            delivered = message.metadata.sequence.consumer
            if delivered != partition.delivered + 1:
                self.stats.gaps += 1
                logger.info(
                    "usage writer %s: partition %d: delivery %d after %d: read again from %d",
                    self.id,
                    partition.number,
                    delivered,
                    partition.delivered,
                    partition.read_to + 1,
                )
                self._unsubscribe(partition)
                return
            partition.delivered = delivered
            seq = message.metadata.sequence.stream
            if seq <= partition.read_to:
                continue  # a consumer made again from an older place
            partition.read_to = seq
            self.stats.messages += 1
            try:
                partition.events.extend(
                    (event, seq) for event in events(message.data, message.headers)
                )
            except MessageInvalid as exc:
                self._dead_letter({"error": str(exc), "stream_seq": seq})

    # --- committing -------------------------------------------------------------
    async def _commit(self) -> None:
        fresh = time.monotonic() - self.config.lease_seconds / 2
        for partition in list(self.held.values()):
            if partition.renewed < fresh:
                self._lose(partition, "its lease was not renewed in time")
        ready = [p for p in self.held.values() if p.read_to > p.committed]
        snapshot = None
        if ready:
            # The positions checked and the commit made on one snapshot: a
            # commit to these partitions by another writer in between fails
            # ours (their application transactions conflict).
            snapshot = await asyncio.to_thread(self.store.snapshot)
            positions = await asyncio.to_thread(
                self.store.positions, [p.number for p in ready], snapshot=snapshot
            )
            for partition in ready:
                if positions[partition.number] != partition.committed:
                    self._lose(partition, "another writer committed to it")
            ready = [p for p in ready if p.number in self.held]
        if ready:
            try:
                written = await self._renewing(asyncio.to_thread(self._write, ready, snapshot))
            except CommitFailedError as exc:
                # Another writer's commit to one of them came first: read them
                # again from the table (the next pass finds whose they are).
                logger.warning("usage writer %s: commit refused (%s): read again", self.id, exc)
                for partition in ready:
                    partition.events, partition.read_to = [], partition.committed
                    self._unsubscribe(partition)
                self._last_commit = time.monotonic()
                return
            for partition in ready:
                partition.committed = partition.read_to
                partition.events = []
            self.stats.events += written
            self.stats.commits += 1
        self._last_commit = time.monotonic()
        for partition in [p for p in self.held.values() if p.releasing]:
            await self._release(partition)

    async def _renewing(self, work):
        """`work` awaited, the leases held renewed meanwhile (a commit of many
        events, or a slow store, can outlast half a lease)."""
        task = asyncio.ensure_future(work)
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.config.lease_seconds / 4)
            if done:
                return task.result()
            try:
                for partition in list(self.held.values()):
                    await self._renew(partition)
            except (TimeoutError, nats.errors.Error) as exc:
                USAGE_LOG.failed(exc, doing=f"usage writer {self.id} renewing", log=logger)

    def _write(self, partitions: list[_Partition], snapshot=None) -> int:
        close_old_connections()
        # A gateway's records, or events the ingestion API took (their
        # source says so): each validated as the ledger validates its source's.
        validators: dict[str, EventValidator] = {}
        rows, seen = [], set()
        for partition in partitions:
            for event, seq in partition.events:
                source = event.get("source")
                source = source if source in EventSource.values else EventSource.GATEWAY
                validator = validators.get(source)
                if validator is None:
                    validator = validators[source] = EventValidator(source=source)
                try:
                    row = validator.row(event)
                except EventInvalid as exc:
                    self._dead_letter({"error": f"{exc.field}: {exc.message}", "record": event})
                    continue
                key = (row[0], row[PHASE])
                if key in seen:
                    self.stats.duplicates += 1
                    continue
                seen.add(key)
                rows.append((*row, partition.number, seq))
        # The windows and hours these events fall in are marked pending in
        # PostgreSQL first (as the ledger marks them): killed between the
        # two, they are computed again from what the table holds, never
        # left unmarked over events it holds. And marked again once the
        # commit is in: a metering run that read the table before it (and
        # would clear the first mark) finds the window marked since, and
        # leaves it pending (metering.windows compares marked_at).
        stale = usage_stale_of(row[: len(LEDGER_COLUMNS)] for row in rows)
        self._mark(stale)
        self.store.commit(
            table(rows, ingested_at=datetime.now(UTC)),
            {p.number: p.read_to for p in partitions},
            snapshot=snapshot,
        )
        self._mark(stale)
        return len(rows)

    @staticmethod
    def _mark(stale) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            usage_stale_mark(cursor.cursor, stale)

    def _dead_letter(self, entry: dict) -> None:
        self.stats.invalid += 1
        self.dead_letter_path.parent.mkdir(parents=True, exist_ok=True)
        with self.dead_letter_path.open("a") as fh:
            fh.write(json.dumps(entry, default=str) + "\n")
        logger.error(
            "usage writer %s: an event dead-lettered to %s: %s",
            self.id,
            self.dead_letter_path,
            entry["error"],
        )
