"""The gateway's durable spool: every completed-request record is appended
to a local file before it is anything else, and leaves only once the
ledger has committed it. A database away for an hour, or a gateway
killed, loses none of it.

Layout. One directory (the spool's root) per gateway host; in it, one slot
per gateway worker process, held with an exclusive flock for as long as
the process lives (`slot-N.lock`, the segments in `slot-N/`). A worker
that dies (SIGKILL, OOM) lets go of its lock with its life; the next
worker to start takes the free slot and replays what is left in it, and
adopts any other free slot's segments (a gateway restarted with fewer
workers leaves none behind).

Segments. `{seq:020d}.seg`: an 8-byte magic, then records, each a frame
of a 16-byte header (payload length, CRC-32 of what follows the CRC,
appended-at epoch milliseconds) and the payload. A record is appended with
one write() to a file opened O_APPEND: a process killed at any moment
leaves whole frames behind (the page cache outlives the process), and
only a machine that loses power can tear the last one, which the CRC
catches. A segment rolls over at `segment_bytes`; one whose every record
the ledger holds is deleted.

Group commit. A syncer thread makes the appended records durable with
fdatasync at most `sync_seconds` after the first record not yet synced,
or at once when `sync_records` wait: the window a power loss can take.
Appending never waits for a disk flush.

Acknowledgement. The ledger writer reads records in order from the oldest
not yet acknowledged, and acknowledges a position once the batch up to it
is committed; the position is also written to `acked` (a checkpoint, so
a restart replays only what was never committed: a stale checkpoint costs
duplicates, which the ledger skips by request id).

Recovery. On opening a slot, each segment is read through: a frame that
is short or fails its CRC ends the good prefix; the bytes from there on
are moved to `torn/` (kept for forensics), counted, and cut from the
segment.

Full. Past `cap_bytes` of segments, or when the disk itself is full
(ENOSPC), append raises SpoolFull and writes nothing (a short write is
cut back): the caller decides what that means for the request (the
gateway's SPOOL_FULL setting). The spool is full until acknowledgements
bring it back under nine tenths of where it filled up.

Standard library only: the gateway's recorder decides what a record is."""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

MAGIC = b"GLSPOOL1"
FRAME = struct.Struct("<IIQ")  # payload length, CRC-32, appended at (epoch ms)
CHECKPOINT = struct.Struct("<QQI")  # segment seq, offset, CRC-32 of both
MAX_RECORD = 1024 * 1024  # a length past this is a torn or foreign frame
READ_CHUNK = 4 * MAX_RECORD
ACKED = "acked"  # the checkpoint's file
MAX_SLOTS = 256
REFILL = 0.9  # full until back under this share of where it filled up


class SpoolFull(Exception):
    """The record was not appended: the cap is reached, or the disk is full."""


@dataclass(frozen=True)
class Position:
    seq: int
    offset: int


@dataclass
class _Segment:
    seq: int
    path: Path
    size: int  # bytes its whole frames end at (what a reader may read up to)
    start: int  # where its first record not committed before begins
    records: int = 0  # records appended or left to replay


@dataclass
class Batch:
    """Records read in order, and the position just after the last one."""

    payloads: list[bytes]
    end: Position
    kept: list = field(default_factory=list)  # each payload's object kept at append, or None


@dataclass
class SpoolStats:
    bytes: int = 0
    appended: int = 0
    acked: int = 0
    replayed: int = 0  # records found on opening, left by a process before
    torn: int = 0  # torn or corrupt tails found on opening
    torn_bytes: int = 0
    syncs: int = 0
    full_events: int = 0
    slots_adopted: list[str] = field(default_factory=list)


def frame(payload: bytes, *, at_ms: int) -> bytes:
    head = struct.pack("<IQ", len(payload), at_ms)
    crc = zlib.crc32(payload, zlib.crc32(head))
    return FRAME.pack(len(payload), crc, at_ms) + payload


def frames(data: bytes | memoryview, offset: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """(end offset, appended at ms, payload) of each whole, sound frame of
    `data` from `offset`; stops at the first that is short or corrupt."""
    view = memoryview(data)
    size = len(view)
    while offset + FRAME.size <= size:
        length, crc, at_ms = FRAME.unpack_from(view, offset)
        end = offset + FRAME.size + length
        if length > MAX_RECORD or end > size:
            return
        payload = bytes(view[offset + FRAME.size : end])
        if zlib.crc32(payload, zlib.crc32(struct.pack("<IQ", length, at_ms))) != crc:
            return
        yield end, at_ms, payload
        offset = end


class Spool:
    def __init__(
        self,
        root: Path,
        *,
        cap_bytes: int,
        segment_bytes: int = 8 * 1024 * 1024,
        sync_seconds: float = 0.01,
        sync_records: int = 512,
        keep_max: int = 10_000,
    ) -> None:
        self.root = Path(root)
        self.keep_max = keep_max
        self._kept: dict[tuple[int, int], object] = {}
        self.cap_bytes = cap_bytes
        self.segment_bytes = segment_bytes
        self.sync_seconds = sync_seconds
        self.sync_records = sync_records
        self.stats = SpoolStats()
        self.full = False
        self.full_why = ""  # "its cap", "a full disk"
        self.slot = ""
        self.dir = self.root
        self._full_at = 0
        # Segments, sizes, positions and counts are shared by the event loop
        # (appending), the ledger writer's thread (reading, acknowledging)
        # and the syncer: each touches them under this lock, briefly.
        self._lock = threading.Lock()
        self._segments: dict[int, _Segment] = {}
        self._active: _Segment | None = None
        self._fd = -1  # the active segment's
        self._next_seq = 1
        self._read_at = Position(0, 0)
        self._acked = Position(0, 0)
        self._read_count = 0
        self._acked_count = 0
        self._unsynced = 0
        self._to_sync: list[int] = []  # descriptors written since the last sync
        self._to_close: list[int] = []  # rolled-over segments', closed once synced
        self._dir_dirty = False
        self._sync_wanted = threading.Event()
        self._sync_now = threading.Event()
        self._closing = False
        self._lock_fd = -1
        self._syncer: threading.Thread | None = None

    # --- opening -------------------------------------------------------------
    @classmethod
    def open(cls, root: Path, **options) -> Spool:
        """Take a free slot under `root` (and any other free slot's
        leftovers), recover what is in it, and start the syncer."""
        spool = cls(root, **options)
        spool._take_slot()
        spool._recover()
        spool._roll()
        spool._syncer = threading.Thread(target=spool._sync_loop, name="spool-sync", daemon=True)
        spool._syncer.start()
        return spool

    def _take_slot(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for n in range(MAX_SLOTS):
            fd = _try_lock(self.root / f"slot-{n}.lock")
            if fd is not None:
                self._lock_fd, self.slot = fd, f"slot-{n}"
                self.dir = self.root / self.slot
                self.dir.mkdir(exist_ok=True)
                return
        raise RuntimeError(f"every one of {MAX_SLOTS} spool slots in {self.root} is held")

    def _recover(self) -> None:
        """Our slot's segments, then every free slot's, renumbered after ours."""
        own = _segment_files(self.dir)
        if not own:  # a checkpoint without segments is stale: numbering starts over
            (self.dir / ACKED).unlink(missing_ok=True)
        for seq, path in own:
            self._recover_segment(seq, path, checkpoint=_checkpoint_read(self.dir))
            self._next_seq = seq + 1
        for lock in sorted(self.root.glob("slot-*.lock")):
            if lock.stem == self.slot:
                continue
            fd = _try_lock(lock)
            if fd is None:  # a live process's
                continue
            try:
                self._adopt(self.root / lock.stem)
            finally:
                os.close(fd)
        first = min(self._segments, default=None)
        if first is not None:
            self._acked = self._read_at = Position(first, self._segments[first].start)

    def _adopt(self, theirs: Path) -> None:
        checkpoint = _checkpoint_read(theirs)
        found = _segment_files(theirs)
        for their_seq, path in found:
            seq = self._next_seq
            self._next_seq += 1
            moved = self.dir / f"{seq:020d}.seg"
            os.replace(path, moved)
            self._recover_segment(seq, moved, checkpoint=checkpoint, named=their_seq)
        if found:
            _fsync_dir(self.dir)
            (theirs / ACKED).unlink(missing_ok=True)
            self.stats.slots_adopted.append(theirs.name)
            logger.warning("spool %s: adopted %d segments of %s", self.slot, len(found), theirs)

    def _recover_segment(
        self, seq: int, path: Path, *, checkpoint: Position | None, named: int | None = None
    ) -> None:
        """The good prefix of a segment kept (what follows quarantined), and
        its records not committed before counted for replay. `named`: the
        seq the checkpoint knows it by (an adopted segment's old one)."""
        data = path.read_bytes()
        named = seq if named is None else named
        if checkpoint is None or named > checkpoint.seq:
            skip_to = len(MAGIC)
        elif named == checkpoint.seq:
            skip_to = checkpoint.offset
        else:
            skip_to = len(data) + 1  # wholly committed
        good = len(MAGIC) if data[: len(MAGIC)] == MAGIC else 0
        start, records = None, 0
        for end, _, _ in frames(data, good) if good else ():
            if good >= skip_to:
                records += 1
                start = good if start is None else start
            good = end
        if good < len(data):
            self._quarantine(path, data, good)
        if records == 0:
            path.unlink()
            return
        if good < len(data):
            os.truncate(path, good)
        self._segments[seq] = _Segment(seq=seq, path=path, size=good, start=start, records=records)
        self.stats.bytes += good
        self.stats.replayed += records

    def _quarantine(self, path: Path, data: bytes, good: int) -> None:
        keep = self.root / "torn"
        keep.mkdir(exist_ok=True)
        kept = keep / f"{self.slot}-{path.stem}-at-{good}.bin"
        kept.write_bytes(data[good:])
        self.stats.torn += 1
        self.stats.torn_bytes += len(data) - good
        logger.error(
            "spool %s: segment %s ends in %d bytes that are no whole record (torn by a "
            "crash, or corrupt): its %d bytes before replay, the rest is kept in %s",
            self.slot,
            path.name,
            len(data) - good,
            good,
            kept,
        )

    # --- appending (the event loop) -------------------------------------------
    def append(self, payload: bytes, *, keep: object = None) -> None:
        """Append one record; SpoolFull (and nothing written) when it cannot.
        `keep`: what the payload was made from, handed back by `read` in its
        place while at most `keep_max` are held (the reader's decoding
        saved: the spool is a mirror of memory until memory would grow)."""
        data = frame(payload, at_ms=int(time.time() * 1000))
        over = self.full or self.stats.bytes + len(data) > self.cap_bytes
        if over and self._active_committed():  # its space is free once it is gone
            self._roll()
            over = self.full or self.stats.bytes + len(data) > self.cap_bytes
        if over:
            self._fill("its cap")
        if self._active.size + len(data) > self.segment_bytes and self._active.records:
            self._roll()
        segment = self._active
        place = (segment.seq, segment.size)
        if keep is not None and len(self._kept) < self.keep_max:
            self._kept[place] = keep  # before the write: a reader may find it at once
        try:
            written = os.write(self._fd, data)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            written = -1
        if written != len(data):
            self._kept.pop(place, None)
            if written > 0:  # a short write on a full disk: cut back to the last whole record
                os.ftruncate(self._fd, segment.size)
            self._fill("a full disk")
        with self._lock:
            segment.size += written
            segment.records += 1
            self.stats.bytes += written
            self.stats.appended += 1
            self._unsynced += 1
            if self._unsynced == 1:
                self._to_sync.append(self._fd)
                self._sync_wanted.set()
            elif self._unsynced >= self.sync_records:
                self._sync_now.set()

    def room(self) -> bool:
        """Whether a record may be appended now (the event loop's question
        before it takes a request): not full, or no longer once a wholly
        committed active segment is let go."""
        if self.full and self._active_committed():
            self._roll()
        return not self.full

    def _active_committed(self) -> bool:
        """Every record of the active segment is in the ledger."""
        acked, active = self._acked, self._active
        return active.records > 0 and acked.seq == active.seq and acked.offset == active.size

    def _fill(self, why: str) -> None:
        if not self.full:
            self.full, self._full_at, self.full_why = True, self.stats.bytes, why
            self.stats.full_events += 1
        raise SpoolFull(self.full_why)

    def _roll(self) -> None:
        """A new segment to append to (the one before is synced and closed
        by the syncer). On a full disk: SpoolFull, the old one still active."""
        path = self.dir / f"{self._next_seq:020d}.seg"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
            try:
                if os.write(fd, MAGIC) != len(MAGIC):
                    raise OSError(errno.ENOSPC, "short write")
            except OSError:
                os.close(fd)
                path.unlink(missing_ok=True)
                raise
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or self._active is None:
                raise
            self._fill("a full disk")
        segment = _Segment(seq=self._next_seq, path=path, size=len(MAGIC), start=len(MAGIC))
        self._next_seq += 1
        with self._lock:
            if self._active is not None:
                self._to_close.append(self._fd)
                if self._active.records == 0 or self._active_committed():
                    self._drop(self._active)
                    self._unfill_if_room()
            elif not self._segments:  # nothing left from before: reading starts here
                self._acked = self._read_at = Position(segment.seq, segment.start)
            self._fd, self._active = fd, segment
            self._segments[segment.seq] = segment
            self.stats.bytes += len(MAGIC)
            self._dir_dirty = True
            self._to_sync.append(fd)
        self._sync_wanted.set()

    # --- syncing (its own thread) ---------------------------------------------
    def _sync_loop(self) -> None:
        while True:
            self._sync_wanted.wait()
            if not self._closing:
                self._sync_now.wait(self.sync_seconds)
            self._sync_wanted.clear()
            self._sync_now.clear()
            self.sync()
            if self._closing:
                return

    def sync(self) -> None:
        """Make everything appended so far durable: fdatasync each segment
        written to, and the directory when a segment was made."""
        with self._lock:
            fds, self._to_sync = self._to_sync, []
            closing, self._to_close = self._to_close, []
            self._unsynced = 0
            dir_dirty, self._dir_dirty = self._dir_dirty, False
        for fd in dict.fromkeys(fds + closing):
            os.fdatasync(fd)
        if dir_dirty:
            _fsync_dir(self.dir)
        for fd in closing:
            os.close(fd)
        self.stats.syncs += 1

    # --- reading and acknowledging (the ledger writer's thread) ---------------
    @property
    def unread(self) -> int:
        """Records appended, or left from before, not yet read."""
        return self.stats.replayed + self.stats.appended - self._read_count

    @property
    def unacked(self) -> int:
        """Records the ledger does not hold yet."""
        return self.stats.replayed + self.stats.appended - self._acked_count

    def read(self, max_records: int) -> Batch:
        """Up to `max_records` records from where the last read ended."""
        payloads: list[bytes] = []
        kept: list = []
        with self._lock:
            at = self._read_at
        while len(payloads) < max_records:
            with self._lock:
                segment = self._segments.get(at.seq)
                size = segment.size if segment is not None else 0
                later = min((s for s in self._segments if s > at.seq), default=None)
                later_start = self._segments[later].start if later is not None else 0
            if at.offset < size:
                with open(segment.path, "rb") as fh:
                    fh.seek(at.offset)
                    data = fh.read(min(size - at.offset, READ_CHUNK))
                offset = 0
                for end, _at_ms, payload in frames(data):
                    payloads.append(payload)
                    kept.append(self._kept.pop((at.seq, at.offset + offset), None))
                    offset = end
                    if len(payloads) == max_records:
                        break
                if offset == 0:
                    raise RuntimeError(f"spool {self.slot}: unreadable record at {at}")
                at = Position(at.seq, at.offset + offset)
            elif later is not None:
                at = Position(later, later_start)
            else:
                break
        with self._lock:
            self._read_at = at
            self._read_count += len(payloads)
        return Batch(payloads=payloads, end=at, kept=kept)

    def rewind(self) -> None:
        """Read again from the oldest record not acknowledged (its batch
        was not committed)."""
        with self._lock:
            self._read_at = self._acked
            self._read_count = self._acked_count

    def ack(self, batch: Batch) -> None:
        """The ledger holds every record up to `batch.end`: segments wholly
        behind it are deleted, and the position is the checkpoint."""
        end = batch.end
        with self._lock:
            self._acked = end
            self._acked_count += len(batch.payloads)
            self.stats.acked += len(batch.payloads)
            # A batch that ends with a segment's last record leaves it wholly
            # behind too: kept, it would hold a full spool full with nothing
            # left to read (the active one goes when it is rolled over).
            behind = [
                segment
                for seq, segment in self._segments.items()
                if seq < end.seq
                or (seq == end.seq and segment is not self._active and end.offset >= segment.size)
            ]
            for segment in behind:
                self._drop(segment)
            self._unfill_if_room()
        _checkpoint_write(self.dir, batch.end)

    def _unfill_if_room(self) -> None:
        if self.full and self.stats.bytes <= self._full_at * REFILL:
            self.full = False

    def _drop(self, segment: _Segment) -> None:
        del self._segments[segment.seq]
        self.stats.bytes -= segment.size
        segment.path.unlink(missing_ok=True)

    # --- state -----------------------------------------------------------------
    def oldest_unacked_age(self) -> float:
        """Seconds since the oldest record the ledger does not hold yet was
        appended (0 with none)."""
        if self.unacked <= 0:
            return 0.0
        with self._lock:
            at = self._acked
            segment = self._segments.get(at.seq)
            if segment is None or at.offset >= segment.size:
                later = min((s for s in self._segments if s > at.seq), default=None)
                if later is None:
                    return 0.0
                segment = self._segments[later]
                at = Position(later, segment.start)
        try:
            with open(segment.path, "rb") as fh:
                fh.seek(at.offset)
                head = fh.read(FRAME.size)
        except FileNotFoundError:  # acknowledged meanwhile
            return 0.0
        if len(head) < FRAME.size:
            return 0.0
        return max(0.0, time.time() - FRAME.unpack(head)[2] / 1000)

    def close(self) -> None:
        """Sync, stop the syncer and let go of the slot. What the ledger
        does not hold stays, for the next process to replay."""
        self._closing = True
        self._sync_wanted.set()
        self._sync_now.set()
        if self._syncer is not None:
            self._syncer.join(timeout=30)
        with self._lock:
            if self._fd >= 0:
                self._to_close.append(self._fd)
                self._fd = -1
        self.sync()
        if self.unacked == 0:
            # The checkpoint first: killed in between, the next process
            # replays duplicates (skipped by the ledger), never skips records.
            (self.dir / ACKED).unlink(missing_ok=True)
            with self._lock:
                for segment in list(self._segments.values()):
                    self._drop(segment)
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1


def _try_lock(path: Path) -> int | None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _segment_files(directory: Path) -> list[tuple[int, Path]]:
    """(seq, path) of the segments in `directory`, oldest first."""
    if not directory.is_dir():
        return []
    return sorted((int(p.stem), p) for p in directory.glob("*.seg") if p.stem.isdigit())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _checkpoint_write(directory: Path, at: Position) -> None:
    """Where the ledger's records end: one small write in place, not
    synced (a checkpoint lost to a crash costs duplicates, not records)."""
    head = struct.pack("<QQ", at.seq, at.offset)
    fd = os.open(directory / ACKED, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.pwrite(fd, head + struct.pack("<I", zlib.crc32(head)), 0)
    finally:
        os.close(fd)


def _checkpoint_read(directory: Path) -> Position | None:
    try:
        data = (directory / ACKED).read_bytes()[: CHECKPOINT.size]
    except FileNotFoundError:
        return None
    if len(data) < CHECKPOINT.size:
        return None
    seq, offset, crc = CHECKPOINT.unpack(data)
    if zlib.crc32(data[:16]) != crc:
        return None
    return Position(seq, offset)
