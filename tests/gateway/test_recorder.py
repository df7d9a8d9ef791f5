"""The record buffer: batches, retries a database outage, dead-letters a
poison record without blocking the rest, flushes everything on close."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

from django.db import IntegrityError, OperationalError

from gateway.recorder import Recorder
from serving.records import CompletedRequest

NOW = datetime(2026, 11, 1, tzinfo=UTC)


def record(n: int) -> CompletedRequest:
    return CompletedRequest(
        request_id=f"r{n}",
        tenant_id=1,
        api_key_id=1,
        model="m",
        received_at=NOW,
        ended_at=NOW,
        status="ok",
        http_status=200,
    )


class FlakySink:
    def __init__(self, *, down_for: int = 0, poison: set[str] = frozenset()):
        self.down_for = down_for
        self.poison = poison
        self.stored: list[str] = []

    def __call__(self, batch):
        if self.down_for > 0:
            self.down_for -= 1
            raise OperationalError("database is away")
        if any(r.request_id in self.poison for r in batch):
            raise IntegrityError("bad foreign key")
        self.stored += [r.request_id for r in batch]


def test_outage_then_poison_then_close(tmp_path):
    sink = FlakySink(down_for=2, poison={"r3"})
    dead = tmp_path / "dead.jsonl"

    async def scenario():
        recorder = Recorder(sink, flush_seconds=0.01, flush_max=100, dead_letter_path=dead)
        recorder.start()
        for n in range(6):
            recorder.add(record(n))
        await asyncio.sleep(0.5)
        recorder.add(record(6))
        await recorder.close()
        return recorder

    recorder = asyncio.run(scenario())
    assert sorted(sink.stored) == ["r0", "r1", "r2", "r4", "r5", "r6"]
    lines = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [line["record"]["request_id"] for line in lines] == ["r3"]
    assert "bad foreign key" in lines[0]["error"]
    assert (recorder.flushed, recorder.dead_lettered, recorder.backlog) == (7, 1, 0)


def test_a_record_after_an_idle_stretch_is_flushed_within_the_flush_period(tmp_path):
    """An idle recorder sleeps until a record comes (no wake-ups for
    nothing), then flushes it on time, and so again after the next lull."""
    sink = FlakySink()

    async def scenario():
        recorder = Recorder(
            sink, flush_seconds=0.05, flush_max=100, dead_letter_path=tmp_path / "dead.jsonl"
        )
        recorder.start()
        seen = []
        for n in range(2):
            await asyncio.sleep(0.3)  # idle
            recorder.add(record(n))
            await asyncio.sleep(0.25)
            seen.append(list(sink.stored))
        await recorder.close()
        return seen

    assert asyncio.run(scenario()) == [["r0"], ["r0", "r1"]]
