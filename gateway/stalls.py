"""Why the gateway's event loop woke up late: the kernel's account of the
loop thread (/proc/self/task/<tid>/schedstat: time on a CPU, time runnable but
waiting for one) and the process's CPU time, read at every tick of the
loop-lag watcher (two cheap reads, a few microseconds), so a stall can be
told apart:

- `loop_cpu_ms` near the stall: the loop thread was busy (our code, or C
  code it called, or the collector);
- `loop_runq_ms` near the stall: it was runnable but the machine gave its
  CPU to someone else;
- neither: it slept in a syscall, or waited for the GIL, which
  `threads_cpu_ms` (the process's other threads' CPU time) then shows.

Linux only: elsewhere every figure is None and a stall is just its length."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path


def _loop_times(fd: int | None) -> tuple[int, int] | None:
    """(ns on a CPU, ns waiting for one) of the thread whose schedstat `fd`
    is open on (read again from its start: no open and close per tick)."""
    if fd is None:
        return None
    try:
        cpu, runq, _ = os.pread(fd, 128, 0).split()
    except (OSError, ValueError):
        return None
    return int(cpu), int(runq)


class StallClock:
    """Made on the event loop's thread; `tick()` at every watcher wake-up,
    `explain()` right after a late one."""

    def __init__(self) -> None:
        path = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat")
        try:
            self._fd: int | None = os.open(path, os.O_RDONLY)
        except OSError:  # not Linux
            self._fd = None
        self.last = (_loop_times(self._fd), time.process_time_ns())

    def tick(self) -> tuple:
        before, self.last = self.last, (_loop_times(self._fd), time.process_time_ns())
        return before

    def waited_for_cpu_ms(self, before: tuple) -> float:  # ok-float
        """How long the loop thread was runnable without a CPU since
        `before` (0 where the kernel does not say)."""
        loop_before, loop_now = before[0], self.last[0]
        if loop_before is None or loop_now is None:
            return 0.0
        return (loop_now[1] - loop_before[1]) / 1e6

    def explain(self, before: tuple) -> dict:
        (loop_before, process_before), (loop_now, process_now) = before, self.last
        if loop_before is None or loop_now is None:
            return {"loop_cpu_ms": None, "loop_runq_ms": None, "threads_cpu_ms": None}
        loop_cpu = (loop_now[0] - loop_before[0]) / 1e6
        others = (process_now - process_before) / 1e6 - loop_cpu
        return {
            "loop_cpu_ms": round(loop_cpu, 1),
            "loop_runq_ms": round((loop_now[1] - loop_before[1]) / 1e6, 1),
            "threads_cpu_ms": {"other threads": round(others, 1)} if others >= 1 else {},
        }


LAG_BOUNDS_MS = (1, 2, 5, 10, 20, 50, 100, 250, 500, 1000, 5000)


class LagRecord:
    """How late each wake-up of the loop-lag watcher came, counted by
    bounds (LAG_BOUNDS_MS, then one count over the last): a percentile
    of the loop's lag over any stretch is read from two copies of the
    counts (`percentile_ms`)."""

    def __init__(self) -> None:
        self.counts = [0] * (len(LAG_BOUNDS_MS) + 1)
        self.max_ms = 0.0  # ok-float: a health statistic

    def add(self, lag_ms: float) -> None:  # ok-float
        self.max_ms = max(self.max_ms, lag_ms)
        for n, bound in enumerate(LAG_BOUNDS_MS):
            if lag_ms <= bound:
                self.counts[n] += 1
                return
        self.counts[-1] += 1

    def as_dict(self) -> dict:
        return {
            "bounds_ms": list(LAG_BOUNDS_MS),
            "counts": list(self.counts),
            "p99_ms": percentile_ms(self.counts, 99),
        }


def percentile_ms(counts: list[int], q: float) -> float | None:  # ok-float
    """The bound under which `q`% of the wake-ups counted came (None: none
    counted; inf: past the last bound)."""
    total = sum(counts)
    if not total:
        return None
    seen = 0
    for n, count in enumerate(counts):
        seen += count
        if seen >= total * q / 100:
            return float(LAG_BOUNDS_MS[n]) if n < len(LAG_BOUNDS_MS) else float("inf")
    return float("inf")
