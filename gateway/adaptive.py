"""Each replica's N (how many requests the gateway lets it run at once),
found from what it does (gateway.concurrency), not set by hand.

Once an interval this polls every adaptive replica's /metrics (vLLM's:
the inter-token latency histogram, requests running and waiting,
preemptions), feeds the interval to the replica's controller, and tells
the process when an N changed (the fair queue's slots follow). A replica
it cannot read, or one on another engine or set to a fixed N, runs at its
max_inflight. N starts at max_inflight: with no evidence the gateway does
what a fixed N does.

The reserve. Past N, the fair queue admits a tenant under its share up to
the replica's max_inflight (its overflow): on an engine whose knee lies at
or past max_inflight nothing would be left for it, and a newcomer would
wait for a flood's request to end (seconds). So N stays under
max_inflight by a reserve sized to what such tenants took: one seat more
than the most overflow slots held at once over the last RESERVE_SECONDS,
or wanted (one more than held while such a tenant waited with none left),
one while none were, at most ceil(max_inflight x overflow). Seats a
newcomer fills still make tokens; only the spare one is lost to a flood
alone (1 of max_inflight). Sized to the peak with no spare seat, the
simulated H200 (docs/benchmarks.md) kept 1 seat more for the flood and
gave the light tenant 3.9x its TTFT p99 alone, against 1.4x, for no
throughput measured (0.90 both)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from gateway.concurrency import TOLERANCE, ConcurrencyLimit, Observation
from gateway.fleet import ReplicaInfo, Router
from gateway.upstream_http import UpstreamClient

logger = logging.getLogger(__name__)

ITL = "vllm:inter_token_latency_seconds"
RUNNING, WAITING = "vllm:num_requests_running", "vllm:num_requests_waiting"
PREEMPTIONS = "vllm:num_preemptions"
RESERVE_SECONDS = 30.0  # the reserve follows the overflow held this recently


@dataclass(frozen=True)
class Sample:
    """What one scrape of a replica's /metrics says (counters as totals)."""

    at: float
    itl_sum: float
    itl_count: float
    running: int
    waiting: int
    preemptions: float


def sample_parse(text: str, *, at: float) -> Sample:
    """The numbers the controller reads, summed over the series' labels."""
    sums = {"itl_sum": 0.0, "itl_count": 0.0, "running": 0.0, "waiting": 0.0, "pre": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == f"{ITL}_sum":
                sums["itl_sum"] += s.value
            elif s.name == f"{ITL}_count":
                sums["itl_count"] += s.value
            elif s.name == RUNNING:
                sums["running"] += s.value
            elif s.name == WAITING:
                sums["waiting"] += s.value
            elif s.name == f"{PREEMPTIONS}_total":
                sums["pre"] += s.value
    return Sample(
        at=at,
        itl_sum=sums["itl_sum"],
        itl_count=sums["itl_count"],
        running=int(sums["running"]),
        waiting=int(sums["waiting"]),
        preemptions=sums["pre"],
    )


def observation(before: Sample, after: Sample) -> Observation:
    """The interval between two scrapes."""
    tokens = after.itl_count - before.itl_count
    step = (after.itl_sum - before.itl_sum) / tokens * 1000 if tokens > 0 else None
    return Observation(
        at=after.at,
        step_ms=step,
        running=after.running,
        waiting=after.waiting,
        preempted=max(0, int(after.preemptions - before.preemptions)),
        running_before=before.running,
    )


class AdaptiveConcurrency:
    """The controllers of one gateway process, and the loop that feeds them."""

    def __init__(
        self,
        router: Router,
        *,
        enabled: bool,
        interval: float,
        least: int,
        tolerance: float = TOLERANCE,
        overflow: float = 0.0,  # ok-float: the fair queue's, a share of max_inflight
        timeout: float = 2.0,
    ) -> None:
        self.router = router
        self.enabled = enabled
        self.interval = interval
        self.least = least
        self.tolerance = tolerance
        self.overflow = overflow
        self.timeout = timeout
        self.limits: dict[int, ConcurrencyLimit] = {}
        # What the fair queue reports: per replica, the most overflow slots
        # held since it was last asked (none with fair queuing off).
        self.overflow_seen: Callable[[], Mapping[int, int]] = dict
        self._overflow_held: dict[int, deque] = {}  # replica -> (at, most held), recent
        self._last: dict[int, Sample] = {}
        self._client = UpstreamClient(keepalive_seconds=0)

    @classmethod
    def from_settings(cls, router: Router, cfg: Mapping) -> AdaptiveConcurrency:
        return cls(
            router,
            enabled=cfg["ADAPTIVE_CONCURRENCY"],
            interval=cfg["CONCURRENCY_SECONDS"],
            least=cfg["CONCURRENCY_MIN"],
            tolerance=cfg["CONCURRENCY_TOLERANCE"],
            overflow=cfg["SLOT_OVERFLOW"],
        )

    def limit(self, replica: ReplicaInfo) -> int:
        """The replica's N now."""
        if not (self.enabled and replica.adaptive):
            return replica.max_inflight
        controller = self.limits.get(replica.id)
        if controller is None or controller.most != replica.max_inflight:
            start = controller.n if controller is not None else replica.max_inflight
            least = min(self.least, replica.max_inflight)
            controller = ConcurrencyLimit(
                least=least, most=replica.max_inflight, start=start, tolerance=self.tolerance
            )
            self.limits[replica.id] = controller
        controller.promise_ms = replica.itl_promise_ms  # the fleet's, reloaded
        room = replica.max_inflight - self.reserve(replica)
        return max(controller.least, min(controller.n, room))

    def _found_replicas(self) -> list[ReplicaInfo]:
        """The replicas in the fleet that have a controller."""
        return [r for r in self.router.snapshot.health_targets if r.id in self.limits]

    def found(self) -> dict[int, int]:
        """Replica id -> N, of each replica found adaptive."""
        return {r.id: self.limit(r) for r in self._found_replicas()}

    def reserve(self, replica: ReplicaInfo) -> int:
        """Seats under max_inflight kept for tenants under their share (the
        module's docstring): 0 with no overflow."""
        most = math.ceil(replica.max_inflight * self.overflow)
        if most == 0:
            return 0
        held = max((n for _, n in self._overflow_held.get(replica.id, ())), default=0)
        return min(most, held + 1)

    def _overflow_note(self, at: float) -> None:
        """Fold in the overflow held since the last round; forget the old."""
        for replica_id, held in self.overflow_seen().items():
            self._overflow_held.setdefault(replica_id, deque()).append((at, held))
        for seen in self._overflow_held.values():
            while seen and seen[0][0] < at - RESERVE_SECONDS:
                seen.popleft()

    def state(self) -> dict[str, dict]:
        """Per replica found adaptive: its N, the reserve kept above it, the
        floor it measures steps against, how many times the floor a step
        may take (the tolerance, or more under an SLO promise), and the
        batch the engine last queued at (N is held under it)."""
        return {
            r.name: {
                "n": self.limit(r),
                "reserve": self.reserve(r),
                "floor_ms": self.limits[r.id].floor_ms and round(self.limits[r.id].floor_ms, 3),
                "allowed": round(self.limits[r.id].allowed(), 3),
                "queued_at": self.limits[r.id].queued_at,
            }
            for r in self._found_replicas()
        }

    async def run(self, changed: Callable[[], Awaitable[None]]) -> None:
        """Poll until cancelled; await `changed()` after a round that moved an N."""
        if not self.enabled:
            return
        try:
            while True:
                started = time.monotonic()
                try:
                    if await self.poll_all():
                        await changed()
                except Exception:  # the next round tries again
                    logger.exception("adaptive concurrency round failed")
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            await self._client.close()

    async def poll_all(self) -> bool:
        """One round; whether any replica's N moved."""
        targets = [
            r
            for group in self.router.snapshot.replicas_by_model.values()
            for r in group
            if r.adaptive
        ]
        samples = await asyncio.gather(*(self._scrape(r) for r in targets))
        was = {r.id: self.limit(r) for r in targets}
        self._overflow_note(time.monotonic())
        for replica, sample in zip(targets, samples, strict=True):
            if sample is None:
                continue
            before = self._last.get(replica.id)
            self._last[replica.id] = sample
            if before is not None:
                self.limits[replica.id].observe(observation(before, sample))
        return any(self.limit(r) != was[r.id] for r in targets)

    async def _scrape(self, replica: ReplicaInfo) -> Sample | None:
        try:
            status, body = await self._client.get(
                replica.base_url + "/metrics", timeout=self.timeout
            )
        except Exception:  # a replica not answering: its health checks say so
            return None
        if status != 200:
            return None
        return sample_parse(body.decode("utf-8", "replace"), at=time.monotonic())
