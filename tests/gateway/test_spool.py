"""The gateway's durable spool: records come back in order and leave only
once acknowledged; a process killed (SIGKILL) or a tail torn by a crash
loses no whole record and replays none twice; a dead worker's slot is
adopted, a live one's never; the cap refuses without writing; and the
recorder keeps an outage's records on disk, not in memory."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from django.db import connection

from gateway.recorder import Recorder
from gateway.spool import FRAME, MAGIC, Spool, SpoolFull
from metering.models import UsageEvent
from metering.sink import usage_event_sink
from serving.records import CompletedRequest
from tests.gateway.test_recorder import FlakySink, record

REPO = Path(__file__).resolve().parents[2]
PAYLOAD_BYTES = 10  # b"record-007"
RECORD_BYTES = FRAME.size + PAYLOAD_BYTES
FOUR_PER_SEGMENT = len(MAGIC) + 4 * RECORD_BYTES


def payload(n: int) -> bytes:
    return b"record-%03d" % n


def segments(directory: Path) -> dict[str, int]:
    """Each segment file's name and size."""
    return {p.name: p.stat().st_size for p in sorted(directory.glob("*.seg"))}


def read_all(spool: Spool) -> list[bytes]:
    got = []
    while batch := spool.read(1000).payloads:
        got += batch
    return got


def spooled(root: Path, count: int) -> Path:
    """`count` records left in a spool by a process that never had them
    acknowledged: the path of its (one) segment."""
    spool = Spool.open(root, cap_bytes=1 << 20)
    for n in range(count):
        spool.append(payload(n))
    spool.close()
    (segment,) = spool.dir.glob("*.seg")
    return segment


def killed_child(root: Path, script: str) -> list[str]:
    """Run `script` (argv[1]: the spool's root) until it prints "go", let it
    go on for half a second, SIGKILL it: the lines it printed."""
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(root)], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline() == "go\n"
        time.sleep(0.5)
    finally:
        child.kill()
        out, _ = child.communicate(timeout=10)
    assert child.returncode == -9
    return out.split()


async def until(condition, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def run_on_one_thread(scenario):
    """asyncio.run, with the ORM's calls on one worker thread whose
    database connection is closed at the end (a connection left open keeps
    the test database from being emptied and dropped)."""

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        try:
            return await scenario()
        finally:
            await loop.run_in_executor(None, lambda: connection.close())

    return asyncio.run(main())


# --- appending, reading, acknowledging -------------------------------------------


def test_records_come_back_in_order_and_leave_with_their_acknowledgement(tmp_path):
    spool = Spool.open(tmp_path, cap_bytes=1 << 20, segment_bytes=FOUR_PER_SEGMENT)
    for n in range(10):
        spool.append(payload(n))
    s1, s2, s3 = segments(spool.dir)
    assert list(segments(spool.dir).values()) == [
        FOUR_PER_SEGMENT,
        FOUR_PER_SEGMENT,
        len(MAGIC) + 2 * RECORD_BYTES,
    ]

    first = spool.read(3)
    assert first.payloads == [payload(n) for n in range(3)]
    spool.ack(first)
    assert list(segments(spool.dir)) == [s1, s2, s3]  # record 3 is still in the first

    second = spool.read(3)
    assert second.payloads == [payload(n) for n in (3, 4, 5)]
    spool.rewind()  # its batch was not committed
    assert spool.unread == 7
    again = spool.read(3)
    assert again.payloads == second.payloads
    assert again.end == second.end
    spool.ack(again)
    assert list(segments(spool.dir)) == [s2, s3]

    # A batch ending with the last record of a segment leaves it with nothing
    # the ledger does not hold.
    third = spool.read(2)
    assert third.payloads == [payload(6), payload(7)]
    spool.ack(third)
    assert list(segments(spool.dir)) == [s3]

    assert spool.read(100).payloads == [payload(8), payload(9)]
    assert spool.read(100).payloads == []
    assert (spool.unread, spool.unacked) == (0, 2)
    spool.rewind()
    spool.ack(spool.read(100))
    assert (spool.unacked, spool.stats.acked, spool.stats.replayed) == (0, 10, 0)

    spool.close()
    assert segments(spool.dir) == {}
    assert not (spool.dir / "acked").exists()


# --- a process killed ----------------------------------------------------------------

APPEND_UNTIL_KILLED = """
import sys
from pathlib import Path
from gateway.spool import Spool

spool = Spool.open(Path(sys.argv[1]), cap_bytes=1 << 30, segment_bytes=64 * 1024)
print("go", flush=True)
n = 0
while True:
    spool.append(b"%09d" % n)
    n += 1
    if n % 1000 == 0:
        print(n, flush=True)
"""


def test_a_process_killed_while_appending_leaves_every_record_it_appended(tmp_path):
    printed = killed_child(tmp_path, APPEND_UNTIL_KILLED)
    last = int(printed[-1])
    assert last >= 1000
    assert len(segments(tmp_path / "slot-0")) > 1  # it rolled over, maybe killed mid-roll

    spool = Spool.open(tmp_path, cap_bytes=1 << 30)
    replayed = read_all(spool)
    k = len(replayed)
    assert k >= last
    assert replayed == [b"%09d" % n for n in range(k)]  # no gap, no duplicate
    assert (spool.slot, spool.stats.slots_adopted) == ("slot-0", [])
    assert (spool.stats.replayed, spool.stats.torn, spool.stats.torn_bytes) == (k, 0, 0)
    assert not (tmp_path / "torn").exists()
    spool.close()


ACK_SIX_THEN_KILLED = """
import sys
import time
from pathlib import Path
from gateway.spool import Spool

spool = Spool.open(Path(sys.argv[1]), cap_bytes=1 << 20, segment_bytes=%d)
for n in range(10):
    spool.append(b"record-%%03d" %% n)
spool.ack(spool.read(6))
spool.read(2)  # read, never committed
print("go", flush=True)
time.sleep(60)
"""


def test_a_restart_replays_only_what_was_never_acknowledged(tmp_path):
    killed_child(tmp_path, ACK_SIX_THEN_KILLED % FOUR_PER_SEGMENT)
    # Records 0-3, 4-7, 8-9 were in three segments: the first one is gone.
    assert len(segments(tmp_path / "slot-0")) == 2

    spool = Spool.open(tmp_path, cap_bytes=1 << 20)
    assert spool.stats.replayed == 4
    assert spool.unacked == 4
    assert read_all(spool) == [payload(n) for n in range(6, 10)]
    spool.close()


# --- a torn tail -----------------------------------------------------------------------


def cut_mid_record(segment: Path) -> bytes:
    data = segment.read_bytes()
    segment.write_bytes(data[:-5])
    return data[-RECORD_BYTES:-5]


def flip_last_byte(segment: Path) -> bytes:
    data = bytearray(segment.read_bytes())
    data[-1] ^= 0xFF
    segment.write_bytes(bytes(data))
    return bytes(data[-RECORD_BYTES:])


@pytest.mark.parametrize("tear", [cut_mid_record, flip_last_byte])
def test_a_torn_last_record_is_kept_aside_and_the_rest_replayed(tmp_path, tear):
    segment = spooled(tmp_path, 5)
    torn = tear(segment)

    spool = Spool.open(tmp_path, cap_bytes=1 << 20)
    assert (spool.stats.torn, spool.stats.torn_bytes) == (1, len(torn))
    assert spool.stats.replayed == 4
    assert segment.stat().st_size == len(MAGIC) + 4 * RECORD_BYTES  # cut back to the good prefix
    (kept,) = (tmp_path / "torn").iterdir()
    assert kept.read_bytes() == torn

    spool.append(b"after-tear")
    assert read_all(spool) == [*(payload(n) for n in range(4)), b"after-tear"]
    spool.close()

    again = Spool.open(tmp_path, cap_bytes=1 << 20)  # nothing torn twice
    assert (again.stats.torn, again.stats.replayed) == (0, 5)
    again.close()


def completed(ledger, request_id: str, tenant) -> CompletedRequest:
    return CompletedRequest(api_key_id=None, **ledger.event(request_id, tenant=tenant))


def test_the_ledger_gets_exactly_the_good_prefix_of_a_torn_spool(ledger_committed, tmp_path):
    ledger = ledger_committed
    tenants = [ledger.a, ledger.b, ledger.a, ledger.b, ledger.a]
    spool = Spool.open(tmp_path, cap_bytes=1 << 20)
    for n, tenant in enumerate(tenants):
        spool.append(completed(ledger, f"torn-{n}", tenant).to_bytes())
    spool.close()
    (segment,) = [p for p in spool.dir.glob("*.seg") if p.stat().st_size > len(MAGIC)]
    segment.write_bytes(segment.read_bytes()[:-7])

    spool = Spool.open(tmp_path, cap_bytes=1 << 20)
    assert (spool.stats.torn, spool.stats.replayed) == (1, 4)
    dead = tmp_path / "dead.jsonl"
    recorder = Recorder(
        usage_event_sink, flush_seconds=0.01, flush_max=100, dead_letter_path=dead, spool=spool
    )

    async def scenario():
        recorder.start()
        await until(lambda: recorder.backlog == 0)
        await recorder.close()

    run_on_one_thread(scenario)
    assert list(UsageEvent.objects.order_by("request_id").values_list("request_id", "tenant")) == [
        ("torn-0", ledger.a.pk),
        ("torn-1", ledger.b.pk),
        ("torn-2", ledger.a.pk),
        ("torn-3", ledger.b.pk),
    ]
    assert (recorder.flushed, recorder.dead_lettered, recorder.replays_written) == (4, 0, 4)
    assert not dead.exists()
    assert segments(spool.dir) == {}


# --- slots ------------------------------------------------------------------------------


def test_a_dead_workers_slot_is_adopted_and_a_live_ones_left_alone(tmp_path):
    live = Spool.open(tmp_path, cap_bytes=1 << 20)
    for n in range(3):
        live.append(b"live-%05d" % n)
    emptied = Spool.open(tmp_path, cap_bytes=1 << 20)
    dead = Spool.open(tmp_path, cap_bytes=1 << 20, segment_bytes=FOUR_PER_SEGMENT)
    assert (live.slot, emptied.slot, dead.slot) == ("slot-0", "slot-1", "slot-2")
    for n in range(8):
        dead.append(payload(n))
    dead.ack(dead.read(3))
    dead.close()  # five never acknowledged, left behind
    emptied.close()  # nothing left: its slot is merely free
    live_files = {p.name: p.read_bytes() for p in live.dir.iterdir()}

    spool = Spool.open(tmp_path, cap_bytes=1 << 20)
    assert spool.slot == "slot-1"
    assert spool.stats.slots_adopted == ["slot-2"]
    assert spool.stats.replayed == 5
    assert read_all(spool) == [payload(n) for n in range(3, 8)]
    assert segments(tmp_path / "slot-2") == {}
    assert not (tmp_path / "slot-2" / "acked").exists()
    assert {p.name: p.read_bytes() for p in live.dir.iterdir()} == live_files
    assert read_all(live) == [b"live-%05d" % n for n in range(3)]
    spool.close()
    live.close()


# --- full -----------------------------------------------------------------------------------


@pytest.mark.parametrize("segment_bytes", [FOUR_PER_SEGMENT, 1 << 20])
def test_the_cap_refuses_a_record_without_writing_it_until_acknowledgements_make_room(
    tmp_path, segment_bytes
):
    spool = Spool.open(tmp_path, cap_bytes=1 << 20, segment_bytes=segment_bytes)
    for n in range(7):
        spool.append(payload(n))
    seven = spool.stats.bytes
    assert seven == sum(segments(spool.dir).values())
    spool.cap_bytes = seven + RECORD_BYTES - 1  # one byte short of an eighth record
    assert not spool.full

    before = segments(spool.dir)
    with pytest.raises(SpoolFull):
        spool.append(payload(7))
    with pytest.raises(SpoolFull):
        spool.append(b"x")  # it would fit, but the spool is full until it drains
    assert segments(spool.dir) == before
    assert (spool.full, spool.room(), spool.stats.appended, spool.stats.full_events) == (
        True,
        False,
        7,
        1,
    )

    batch = spool.read(100)
    assert batch.payloads == [payload(n) for n in range(7)]
    spool.ack(batch)
    assert spool.room()
    assert len(segments(spool.dir)) == 1  # only the one appended to next
    spool.append(payload(7))
    assert spool.read(100).payloads == [payload(7)]
    spool.close()


def test_leftovers_over_the_cap_once_acknowledged_give_room_again(tmp_path):
    """A restart into a smaller cap (or a spool filled by an outage): full
    from the start, and no longer once the leftovers are in the ledger,
    whatever the size of the batches they went in."""
    spooled(tmp_path, 4)
    spool = Spool.open(tmp_path, cap_bytes=len(MAGIC) + 3 * RECORD_BYTES)
    with pytest.raises(SpoolFull):
        spool.append(payload(4))
    batch = spool.read(4)  # to the last record of the leftovers' segment, no further
    assert batch.payloads == [payload(n) for n in range(4)]
    spool.ack(batch)
    assert (spool.unread, spool.unacked) == (0, 0)
    assert spool.room()
    spool.append(payload(4))
    assert read_all(spool) == [payload(4)]
    spool.close()


# --- the recorder on a spool ----------------------------------------------------------


def test_an_outage_keeps_records_in_the_spool_and_a_poison_record_is_dead_lettered(tmp_path):
    sink = FlakySink(down_for=1_000_000)
    dead = tmp_path / "dead.jsonl"
    spool = Spool.open(tmp_path / "spool", cap_bytes=1 << 20, segment_bytes=FOUR_PER_SEGMENT * 8)
    recorder = Recorder(sink, flush_seconds=0.01, flush_max=100, dead_letter_path=dead, spool=spool)

    async def scenario():
        recorder.start()
        for n in range(5):
            recorder.add(record(n))
        await asyncio.sleep(0.3)
        during = (
            recorder._pending,
            recorder.backlog,
            spool.unacked,
            sink.stored,
            1_000_000 - sink.down_for,
        )
        assert during[:4] == ([], 5, 5, [])
        assert during[4] >= 2  # retried meanwhile

        sink.down_for = 0
        await until(lambda: recorder.backlog == 0)
        assert sink.stored == [f"r{n}" for n in range(5)]

        sink.poison = {"r7"}
        for n in range(5, 10):
            recorder.add(record(n))
        await until(lambda: recorder.backlog == 0)
        await asyncio.sleep(0.2)  # time to retry, were the poison record kept
        await recorder.close()

    asyncio.run(scenario())
    assert sink.stored == [f"r{n}" for n in range(10) if n != 7]
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [line["record"]["request_id"] for line in lines] == ["r7"]
    assert (spool.stats.appended, spool.stats.acked) == (10, 10)
    assert (recorder.flushed, recorder.dead_lettered) == (10, 1)
    assert segments(spool.dir) == {}
