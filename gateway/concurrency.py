"""How many requests one replica should run at once (its N), found from
what it does rather than set by hand: the knee of its step-time curve.

On a GPU (and on a CPU core with a memory-bound model) a decode step
streams the weights once for the whole batch, so its time barely grows
with the batch until the batch is large; past the knee every request added
slows every other one. The controller holds the replica where a step takes
at most TOLERANCE times a step at a small batch (its floor), as the Gateway
API Inference Extension's flow control and Netflix's concurrency-limits
(a latency gradient) do.

Fed once an interval with the replica's own numbers (vLLM's /metrics: the
mean inter-token latency over the interval, requests running and waiting,
preemptions), it answers the new N:

- the engine queued requests itself (waiting > 0) or preempted one: the
  batch is past what the engine holds; N drops to 0.9 x what was running,
  and grows no further than that batch for FLOOR_SECONDS;
- N was in use (running >= USED x N) and a step took `ratio` times the
  floor: on the flat of the curve (ratio < FLAT) N grows x STEP_UP; past
  it N moves by (TOLERANCE / ratio) ** GAIN, at least x STEP_DOWN: up while
  the step is under the knee, down past it;
- N not in use: no evidence about N, it stays.

The floor is the lowest step seen at a small batch (running <= N / 4, or
2) over the last FLOOR_SECONDS: a replica slowed for good (a neighbour on
its core) is held to its old floor until the floor window forgets it, so
N backs off while the neighbour stays and recovers when it leaves. Pure
computation: the gateway polls the replica and applies N to its slots."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

TOLERANCE = 1.3  # a step at N: at most this many times a step at a small batch
GAIN = 0.5  # how much of the way to the target one interval goes
STEP_UP, STEP_DOWN = 1.5, 0.5  # the most N moves in one interval
USED = 0.8  # N is in use when this share of it is running
FLAT = 1.1  # a step under this many times the floor: the curve is still flat
FLOOR_SECONDS = 300.0


@dataclass(frozen=True)
class Observation:
    """One interval of a replica, as its engine reports it."""

    at: float  # seconds (monotonic)
    step_ms: float | None  # mean inter-token latency over the interval; None: no tokens
    running: int
    waiting: int
    preempted: int = 0  # preemptions during the interval


@dataclass
class ConcurrencyLimit:
    """One replica's N within [least, most], starting at `start`."""

    least: int = 1
    most: int = 256
    start: int = 8
    limit: float = field(init=False)
    _floors: deque = field(init=False, default_factory=deque)  # (at, step_ms), ascending steps
    _ceiling: tuple[float, int] | None = field(init=False, default=None)  # (at, engine's batch)

    def __post_init__(self) -> None:
        self.limit = float(min(max(self.start, self.least), self.most))

    @property
    def n(self) -> int:
        return max(self.least, min(self.most, int(self.limit)))

    @property
    def floor_ms(self) -> float | None:
        return self._floors[0][1] if self._floors else None

    def observe(self, seen: Observation) -> int:
        """The new N after one interval."""
        if seen.step_ms is not None and seen.running <= max(2, self.n // 4):
            self._floor_add(seen.at, seen.step_ms)
        self._floor_forget(seen.at)
        if self._ceiling is not None and self._ceiling[0] < seen.at - FLOOR_SECONDS:
            self._ceiling = None  # the engine may hold more now: found again if not
        if seen.waiting > 0 or seen.preempted > 0:
            self._ceiling = (seen.at, max(self.least, seen.running))
            self.limit = max(self.least, min(self.limit, 0.9 * seen.running))
        elif seen.step_ms is not None and self.floor_ms and seen.running >= USED * self.n:
            ratio = seen.step_ms / self.floor_ms
            # Flat (no dearer than the floor, give or take noise): the knee is
            # further on, and nothing says how far; near it, a step towards it.
            move = STEP_UP if ratio < FLAT else (TOLERANCE / ratio) ** GAIN
            grown = self.limit * min(STEP_UP, max(STEP_DOWN, move))
            if move > 1:  # at least one more, however small N is
                grown = max(grown, self.limit + 1)
            most = self.most if self._ceiling is None else min(self.most, self._ceiling[1])
            self.limit = min(float(most), max(float(self.least), grown))
        return self.n

    def _floor_add(self, at: float, step_ms: float) -> None:
        # A monotonic deque: the front is the lowest step still in the window.
        while self._floors and self._floors[-1][1] >= step_ms:
            self._floors.pop()
        self._floors.append((at, step_ms))

    def _floor_forget(self, now: float) -> None:
        while len(self._floors) > 1 and self._floors[0][0] < now - FLOOR_SECONDS:
            self._floors.popleft()
