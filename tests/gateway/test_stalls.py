"""The gateway's stall record says why its event loop woke up late: its
own thread busy, its thread waiting for a CPU, or another thread running."""

import threading
import time
from pathlib import Path

import pytest

from gateway.stalls import StallClock

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/task").is_dir(), reason="the kernel's thread accounts are Linux's"
)


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def test_a_busy_loop_thread_shows_as_its_own_cpu_time():
    clock = StallClock()
    _spin(0.3)
    why = clock.explain(clock.tick())
    assert why["loop_cpu_ms"] >= 200
    assert why["loop_cpu_ms"] + why["loop_runq_ms"] >= 290


def test_a_loop_thread_asleep_shows_neither_its_cpu_nor_waiting_for_one():
    clock = StallClock()
    time.sleep(0.3)  # as blocked in a call
    why = clock.explain(clock.tick())
    assert why["loop_cpu_ms"] < 50
    assert why["loop_runq_ms"] < 250


def test_another_thread_running_meanwhile_is_named_with_its_cpu_time():
    spinner = threading.Thread(target=_spin, args=(0.5,))
    spinner.start()
    clock = StallClock()  # the spinner is seen at both ends
    spinner.join(timeout=0.35)  # the loop thread waits, as for the GIL
    why = clock.explain(clock.tick())
    spinner.join()
    assert why["loop_cpu_ms"] < 50
    assert sum(why["threads_cpu_ms"].values()) >= 200
