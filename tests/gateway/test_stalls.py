"""The gateway's stall record says why its event loop woke up late: its
own thread busy, its thread waiting for a CPU, or another thread running."""

import threading
import time
from pathlib import Path

import pytest

from gateway.stalls import StallClock
from tests.fleet import gateway_worker

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="the kernel's thread accounts are Linux's"
)


def _spin(cpu_seconds: float) -> None:
    """Busy until this thread has had `cpu_seconds` of a CPU: on a shared
    box a wall-clock spin gets less, and the rest (waiting for a CPU, or
    taken by the hypervisor or interrupts, which no thread's account
    shows) would make the figures below the machine's, not the code's."""
    until = time.thread_time() + cpu_seconds
    while time.thread_time() < until:
        pass


def test_a_busy_loop_thread_shows_as_its_own_cpu_time():
    clock = StallClock()
    _spin(0.3)
    why = clock.explain(clock.tick())
    assert 290 <= why["loop_cpu_ms"] < 350  # the kernel's clocks differ by a few ms


def test_a_loop_thread_asleep_shows_neither_its_cpu_nor_waiting_for_one():
    clock = StallClock()
    time.sleep(0.3)  # as blocked in a call
    why = clock.explain(clock.tick())
    assert why["loop_cpu_ms"] < 50
    assert why["loop_runq_ms"] < 250


def test_another_thread_running_meanwhile_is_named_with_its_cpu_time():
    clock = StallClock()
    spinner = threading.Thread(target=_spin, args=(0.3,))
    spinner.start()
    spinner.join()  # the loop thread waits, as for the GIL
    why = clock.explain(clock.tick())
    assert why["loop_cpu_ms"] < 50
    assert sum(why["threads_cpu_ms"].values()) >= 290  # a finished thread's time counts


def test_the_loop_lag_percentile_is_read_from_counts_by_bound():
    from gateway.stalls import LagRecord, percentile_ms

    record = LagRecord()
    for _ in range(98):
        record.add(0.4)  # ms
    record.add(3.0)
    record.add(60.0)
    assert record.counts[:7] == [98, 0, 1, 0, 0, 0, 1]
    assert record.as_dict()["p99_ms"] == 5  # the 99th of 100 came within 5 ms
    assert percentile_ms(record.counts, 100) == 100  # the worst within 100 ms
    assert record.max_ms == 60.0
    # Over a stretch: two copies of the counts, subtracted.
    before = list(record.counts)
    record.add(7000.0)
    stretch = [a - b for a, b in zip(record.counts, before, strict=True)]
    assert percentile_ms(stretch, 99) == float("inf")
    assert percentile_ms([0] * len(stretch), 99) is None


def test_a_loop_thread_sharing_its_core_with_another_process_shows_its_wait_for_a_cpu():
    """The part of a late wake-up the machine caused, not the gateway (the
    loop lag's 'own' part leaves it out)."""
    import os
    import subprocess
    import sys

    core = {min(os.sched_getaffinity(0))}
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"],
        preexec_fn=lambda: os.sched_setaffinity(0, core),
    )
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, core)
    try:
        time.sleep(0.2)  # the spinner runs
        clock = StallClock()
        _spin(0.4)  # wall time: about half of it on the core
        waited = clock.waited_for_cpu_ms(clock.tick())
    finally:
        os.sched_setaffinity(0, mine)
        spinner.kill()
        spinner.wait()
    assert waited >= 100


def test_the_loop_lag_is_sampled_while_requests_are_in_flight_and_never_while_idle():
    """An idle gateway's watcher is parked (its wake-ups were half an idle
    gateway's CPU); a request in flight wakes it, and it samples until the
    last one ends."""
    import asyncio

    from gateway.process import Gateway

    async def scenario():
        gateway = Gateway()

        async def completion(scope, receive, send, kind):
            assert gateway.health()["requests_in_flight"] == 1
            await asyncio.sleep(0.3)

        gateway.completion = completion
        watcher = asyncio.create_task(gateway._watch_loop_lag(period=0.01))
        await asyncio.sleep(0.3)
        idle = sum(gateway.loop_lag.counts)
        scope = {"path": "/v1/chat/completions", "method": "POST"}
        await gateway.handle(scope, None, None)
        busy = sum(gateway.loop_lag.counts) - idle
        in_flight_after = gateway.in_flight
        await asyncio.sleep(0.3)
        after = sum(gateway.loop_lag.counts) - idle - busy
        watcher.cancel()
        return idle, busy, after, in_flight_after

    idle, busy, after, in_flight_after = asyncio.run(scenario())
    assert idle == 0
    assert busy >= 10  # every 10 ms for 300 ms, less what a busy machine delays
    assert after <= 1  # the tick under way when the request ended
    assert in_flight_after == 0


def test_the_gateways_loop_waits_at_most_half_a_millisecond_for_a_thread_holding_the_lock(fleet):
    """The recorder's thread validates each flush of records holding the
    interpreter's lock; a request arriving meanwhile waits for it until the
    thread is asked to hand it over: after GATEWAY["GIL_SWITCH_SECONDS"],
    not Python's 5 ms (bench/gateway_hop measures what it buys)."""
    assert gateway_worker(fleet.gateway)["gil_switch_ms"] == 0.5
