"""How many requests one replica should run at once (its N), found from
what it does rather than set by hand: the knee of its step-time curve.

On a GPU (and on a CPU core with a memory-bound model) a decode step
streams the weights once for the whole batch, so its time barely grows
with the batch until the batch is large; past the knee every request added
slows every other one. The controller holds the replica where a step takes
at most TOLERANCE times a step at a small batch (its floor), as the Gateway
API Inference Extension's flow control and Netflix's concurrency-limits
(a latency gradient) do. Where the replica's tenants are promised an
inter-token p95 (an SLO policy) the step may grow further, up to
PROMISE_SHARE of the promise: the knee favours latency, while an operator
sells throughput up to what it promised.

Fed once an interval with the replica's own numbers (vLLM's /metrics: the
mean inter-token latency over the interval, requests running and waiting,
preemptions), it answers the new N:

- the engine preempted a request, or kept more than a few requests
  waiting (at least 2, or N / 8) two intervals running (fewer are only
  arrivals between two steps): the batch is past what the engine holds;
  N drops to 0.9 x what was running, and grows no further than that
  batch for CEILING_SECONDS;
- a step took `ratio` times the floor. On the flat of the curve (ratio <
  FLAT) N grows x STEP_UP, if it was in use (running >= USED x N: else
  nothing says more would do); past it N moves by (allowed / ratio) **
  GAIN from what ran (allowed: TOLERANCE, or the promise's share; at
  least x STEP_DOWN): down past the knee, up under it;
  down only once the last N is in effect (the batch drained to DRAINED x N:
  a replica of long requests takes seconds to);
- the floor is the lowest step seen at a batch of FLOOR_BATCH or fewer
  (at both ends of its interval: a batch draining to it is not one)
  over the last FLOOR_SECONDS (the last one seen, if none since). A
  replica always busy shows none: after PROBE_AFTER without one, N is held
  to FLOOR_BATCH until the batch drains to it and one interval is measured
  (a probe), and N goes back to where it was; so too when a step at a
  larger batch comes in under the floor (the replica sped up). A probe
  that drained nothing in PROBE_SECONDS (requests that run longer) is
  not tried again for PROBE_AFTER: N stays where it was meanwhile.

A replica that slows (a neighbour on its GPU) is measured against its old
floor: N backs off at once, and, the neighbour staying, the window
forgets the old floor and N finds the knee of the slower replica; when
the neighbour leaves, a step under the floor sets off a probe, and N
goes back to the faster replica's knee. Pure computation: gateway.adaptive
polls the replicas and applies N to their slots."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# A step at N: at most this many times a step at a small batch. A latency
# knee: on an H200 (bench/device_steps.py) a Llama-8B's step reaches 1.3x at
# a batch of about 23 (2,048 tokens of context), where a batch of 256 runs
# 3.7x the tokens a second at 3.9x the step of one; an operator selling throughput
# sets GATEWAY_CONCURRENCY_TOLERANCE higher.
TOLERANCE = 1.3
# Where the tenants are promised an inter-token p95 (billing's SLO policies),
# N may go past the knee while the mean step stays within this share of the
# promise (the p95 runs above the mean: a step that carries a prefill):
# throughput up to what the promise allows, as an operator sells it.
PROMISE_SHARE = 0.8
GAIN = 0.5  # how much of the way to the target one interval goes
STEP_UP, STEP_DOWN = 1.5, 0.5  # the most N moves in one interval
USED = 0.8  # N is in use when this share of it is running
FLAT = 1.1  # a step under this many times the floor: the curve is still flat
FLOOR_SECONDS = 30.0  # the floor: the lowest small-batch step this recent
PROBE_AFTER = 600.0  # no small-batch step for this long: measure one (a probe)
FASTER = 0.95  # a step under this share of the floor: the replica sped up, measure again
FLOOR_BATCH = 4  # a step at this batch or smaller is the floor's
CEILING_SECONDS = 60.0  # how long N stays under a batch the engine queued at
PROBE_SECONDS = 10.0  # the most a probe holds N down (N = FLOOR_BATCH: it costs throughput)
# N is in effect once at most this many times N run (past N: the fair
# queue's overflow, a quarter of N at most, for tenants under their share).
DRAINED = 1.25


@dataclass(frozen=True)
class Observation:
    """One interval of a replica, as its engine reports it."""

    at: float  # seconds (monotonic)
    step_ms: float | None  # mean inter-token latency over the interval; None: no tokens
    running: int
    waiting: int
    preempted: int = 0  # preemptions during the interval
    # Running when the interval began (None: not known). A step counts
    # towards the floor only when the batch was small at both ends: an
    # interval in which a large batch drained to a small one has the large
    # batch's steps in its mean.
    running_before: int | None = None


@dataclass
class ConcurrencyLimit:
    """One replica's N within [least, most], starting at `start`."""

    least: int = 1
    most: int = 256
    start: int = 8
    tolerance: float = TOLERANCE  # GATEWAY_CONCURRENCY_TOLERANCE
    promise_ms: float | None = None  # the inter-token p95 promised here (None: none)
    limit: float = field(init=False)
    _floors: deque = field(init=False, default_factory=deque)  # (at, step_ms), ascending steps
    _ceiling: tuple[float, int] | None = field(init=False, default=None)  # (at, engine's batch)
    _waited: bool = field(init=False, default=False)  # the engine had requests waiting last time
    _probe: tuple[float, float] | None = field(init=False, default=None)  # (N before, since)
    _gave_up: float | None = field(init=False, default=None)  # a probe ended with no floor, at

    def __post_init__(self) -> None:
        self.limit = float(min(max(self.start, self.least), self.most))

    @property
    def n(self) -> int:
        return max(self.least, min(self.most, int(self.limit)))

    @property
    def floor_ms(self) -> float | None:
        return self._floors[0][1] if self._floors else None

    @property
    def queued_at(self) -> int | None:
        """The engine's batch when it last queued or preempted (N is held
        under it for CEILING_SECONDS); None when it has not lately."""
        return self._ceiling[1] if self._ceiling else None

    def observe(self, seen: Observation) -> int:
        """The new N after one interval."""
        small = seen.running <= FLOOR_BATCH and (seen.running_before or 0) <= FLOOR_BATCH
        if seen.step_ms is not None and small:
            self._floor_add(seen.at, seen.step_ms)
        self._floor_forget(seen.at)
        if self._probe is not None:
            return self._probing(seen, floor_taken=seen.step_ms is not None and small)
        if self._ceiling is not None and self._ceiling[0] < seen.at - CEILING_SECONDS:
            self._ceiling = None  # the engine may hold more now: found again if not
        # Requests that arrived between two steps wait too: a queue is more
        # than a few of them, twice running.
        waiting = seen.waiting >= max(2, self.n / 8)
        queued, self._waited = waiting and self._waited, waiting
        if queued or seen.preempted > 0:
            self._ceiling = (seen.at, max(self.least, seen.running))
            self.limit = max(self.least, min(self.limit, 0.9 * seen.running))
            return self.n
        if seen.step_ms is None:
            return self.n
        stale = not self._floors or self._floors[-1][0] < seen.at - PROBE_AFTER
        if stale or seen.step_ms < FASTER * self.floor_ms:
            # No floor, none lately, or a step at this batch under it (the
            # replica sped up): measure one at a small batch.
            retry = self._gave_up is None or self._gave_up <= seen.at - PROBE_AFTER
            if not small and self.least <= FLOOR_BATCH < self.n and retry:
                self._probe = (self.limit, seen.at)
                self.limit = float(FLOOR_BATCH)
                return self.n
            if stale:
                return self.n
        ratio = seen.step_ms / self.floor_ms
        # Flat (no dearer than the floor, give or take noise): the knee is
        # further on, and nothing says how far; near it, a step towards it.
        move = STEP_UP if ratio < FLAT else (self.allowed() / ratio) ** GAIN
        move = min(STEP_UP, max(STEP_DOWN, move))
        if move >= 1:
            if seen.running < USED * self.n:
                return self.n  # N not in use: nothing says more would do
            grown = max(self.limit * move, self.limit + 1)
        elif seen.running > DRAINED * self.n:
            # A lower N not yet in effect: requests that run long (seconds)
            # drain slowly, and cutting again at every interval on steps of
            # the batch from before would take N far under the knee.
            return self.n
        else:
            grown = min(self.limit, seen.running) * move  # down from what ran
        most = self.most if self._ceiling is None else min(self.most, self._ceiling[1])
        self.limit = min(float(most), max(float(self.least), grown))
        return self.n

    def allowed(self) -> float:
        """How many times the floor a step at N may take: the tolerance, or
        more where the promise allows it."""
        if self.promise_ms is None or not self._floors:
            return self.tolerance
        return max(self.tolerance, PROMISE_SHARE * self.promise_ms / self.floor_ms)

    def _probing(self, seen: Observation, *, floor_taken: bool) -> int:
        """N held at FLOOR_BATCH until an interval at that batch was
        measured (or PROBE_SECONDS passed); then back where it was."""
        before, since = self._probe
        if floor_taken or seen.at - since >= PROBE_SECONDS:
            self.limit, self._probe = before, None
            # None measured (requests longer than the probe): N stays where
            # it was, as a fixed N would, until the next try.
            self._gave_up = None if floor_taken else seen.at
        return self.n

    def _floor_add(self, at: float, step_ms: float) -> None:
        # A monotonic deque: the front is the lowest step still in the window.
        while self._floors and self._floors[-1][1] >= step_ms:
            self._floors.pop()
        self._floors.append((at, step_ms))

    def _floor_forget(self, now: float) -> None:
        while len(self._floors) > 1 and self._floors[0][0] < now - FLOOR_SECONDS:
            self._floors.popleft()
