"""Why the gateway's event loop woke up late: the kernel's per-thread
accounts (/proc/self/task/*/schedstat: time on a CPU, time runnable but
waiting for one) read at every tick of the loop-lag watcher, so a stall
can be told apart:

- `loop_cpu_ms` near the stall: the loop thread was busy (our code, or C
  code it called, or the collector);
- `loop_runq_ms` near the stall: it was runnable but the machine gave its
  CPU to someone else;
- neither: it slept in a syscall, or waited for the GIL, which
  `threads_cpu_ms` (the other threads' CPU time, by name) then shows who had.

Linux only: elsewhere every figure is None and a stall is just its length."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

TASKS = Path("/proc/self/task")


@dataclass(frozen=True)
class ThreadTimes:
    cpu_ns: int
    runq_ns: int
    name: str


def _times() -> dict[int, ThreadTimes]:
    out: dict[int, ThreadTimes] = {}
    try:
        tids = os.listdir(TASKS)
    except OSError:
        return out
    for tid in tids:
        try:
            cpu, runq, _ = (TASKS / tid / "schedstat").read_text().split()
            name = (TASKS / tid / "comm").read_text().strip()
        except (OSError, ValueError):
            continue  # the thread ended, or no schedstat here
        out[int(tid)] = ThreadTimes(int(cpu), int(runq), name)
    return out


class StallClock:
    """Made on the event loop's thread; `tick()` at every watcher wake-up,
    `explain()` right after a late one."""

    def __init__(self) -> None:
        self.loop_tid = threading.get_native_id()
        self.last = _times()

    def tick(self) -> dict[int, ThreadTimes]:
        before, self.last = self.last, _times()
        return before

    def explain(self, before: dict[int, ThreadTimes]) -> dict:
        now = self.last
        loop_before, loop_now = before.get(self.loop_tid), now.get(self.loop_tid)
        if loop_before is None or loop_now is None:
            return {"loop_cpu_ms": None, "loop_runq_ms": None, "threads_cpu_ms": None}
        others: dict[str, float] = {}
        for tid, t in now.items():
            if tid == self.loop_tid or tid not in before:
                continue
            spent = (t.cpu_ns - before[tid].cpu_ns) / 1e6
            if spent >= 1:
                others[t.name] = round(others.get(t.name, 0) + spent, 1)
        return {
            "loop_cpu_ms": round((loop_now.cpu_ns - loop_before.cpu_ns) / 1e6, 1),
            "loop_runq_ms": round((loop_now.runq_ns - loop_before.runq_ns) / 1e6, 1),
            "threads_cpu_ms": others,
        }
