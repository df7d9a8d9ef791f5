"""Active health checks of the replicas, as Envoy's active health checking
and vLLM's production-stack router do them.

Every GATEWAY_HEALTH_INTERVAL_SECONDS the gateway asks each replica
registered and not draining for its engine's health endpoint
(serving.engines: vLLM `GET /health`, NIM `/v1/health/ready`, Triton
`/health/ready`; an OpenAI-compatible server that has none, `GET
/v1/models`), on a connection of its own. A check fails when the answer is
not 2xx within GATEWAY_HEALTH_TIMEOUT_SECONDS, save a check that timed out
on a replica that answered one of this gateway's requests within the last
interval and timeout: it is busy, not gone (a saturated engine still
serving slows its health endpoint too; taking it out turns overload into
an outage: bench/fleet found a Dynamo frontend marked down so, and its
pool's traffic refused, at 64 workers past the rate kept up with). A
replica goes down after
UNHEALTHY_THRESHOLD failures in a row and comes back up after
HEALTHY_THRESHOLD successes in a row: one dropped check, or one answer from
a replica still coming up, changes nothing.

A replica down:

- gets no request from this gateway from that moment (Router.down). With
  every replica that could take a request down, the request is answered
  503 `no_replica` (Retry-After: 1), without trying one: a replica failing
  its checks K times is an engine gone, and a request sent there would
  wait out a connect timeout to learn it (unlike Envoy's panic mode, which
  routes to all hosts when too few pass). A replica that fails a request
  between checks is still skipped for GATEWAY_SUSPECT_SECONDS (gateway.fleet);
- is down in the database with since when and why (serving.services.
  replica_health_record), so /fleet/ shows it and every other gateway,
  told of the change (core.changes), stops routing to it too;
- shows in this gateway's metrics: gateway_replica_up{replica} 0, and
  gateway_replica_health_transitions_total{replica, to} counts the changes.
  Each worker of a `manage.py gateway --workers N` checks on its own: the
  gauge is 1 only while every worker routes to the replica, and each
  worker counts the changes it finds.

Several gateways check on their own. Each writes only the changes it finds
itself, in a conditional update: the second gateway to find a replica down
writes nothing, so the row changes once per real change. A gateway that
hears a replica it thinks up went down in the database (another gateway
found it, or the scraper) takes it out of its routing too, and writes it
up again only after HEALTHY_THRESHOLD successes of its own: a replica that
one gateway cannot reach and the others can ends up in the database and in
their routing, and in that gateway's gauge as down (a network fault near
one gateway, for its operator to see). A change not written (the database
away) is written by a later round. The Celery scraper (serving.scraper)
writes the status too: where it and the gateways disagree for good (it
cannot reach a replica they can), the row goes down at each of its scrapes
and back up HEALTHY_THRESHOLD checks later."""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from gateway.fleet import ReplicaInfo, Router
from gateway.orm import orm
from gateway.telemetry import REPLICA_TRANSITIONS, replicas_up_set
from gateway.upstream_http import UpstreamClient
from serving.engines import engine_spec

logger = logging.getLogger("gateway.health")
DOWN_ELSEWHERE = "marked down in the database (another gateway or the scraper)"


@dataclass
class ReplicaHealth:
    """What this gateway knows of one replica's health."""

    up: bool
    since: float  # epoch seconds of the last change (or of first sight)
    up_in_database: bool  # as the last fleet snapshot read it
    failures: int = 0  # checks failed in a row
    successes: int = 0  # checks passed in a row
    reason: str = ""  # why it went down
    unwritten: bool = False  # the last change is not in the database yet


@dataclass(frozen=True)
class Change:
    replica_id: int
    up: bool
    reason: str
    # Heard from the database, not found here: nothing to write.
    heard: bool = False


class HealthBook:
    """The thresholds' arithmetic, apart from any I/O: fed each check's
    result (`observe`) and each fleet snapshot's view (`sync`), it says when
    a replica goes down or comes back up."""

    def __init__(
        self, *, unhealthy: int, healthy: int, clock: Callable[[], float] = time.time
    ) -> None:
        self.unhealthy = max(1, unhealthy)
        self.healthy = max(1, healthy)
        self.states: dict[int, ReplicaHealth] = {}
        self._clock = clock

    def sync(self, up_in_database: Mapping[int, bool]) -> list[Change]:
        """The replicas to check, each up or down in the database now. One
        seen for the first time starts as the database says (a replica just
        registered is up until its checks say otherwise); one gone
        (deregistered, draining) is forgotten; one that went down there
        while up here goes down here too."""
        changes = []
        for replica_id in set(self.states) - set(up_in_database):
            del self.states[replica_id]
        for replica_id, up in up_in_database.items():
            state = self.states.get(replica_id)
            if state is None:
                self.states[replica_id] = ReplicaHealth(
                    up=up, since=self._clock(), up_in_database=up
                )
                continue
            if state.up_in_database and not up and state.up:
                self._change(state, up=False, reason=DOWN_ELSEWHERE)
                state.unwritten = False  # the database says so already
                changes.append(Change(replica_id, False, DOWN_ELSEWHERE, heard=True))
            state.up_in_database = up
        return changes

    def observe(self, replica_id: int, *, error: str | None) -> Change | None:
        """One check's result (`error` None: it passed); the change it
        makes, if any."""
        state = self.states.get(replica_id)
        if state is None:  # forgotten while its check ran
            return None
        if error is None:
            state.successes, state.failures = state.successes + 1, 0
            if not state.up and state.successes >= self.healthy:
                reason = f"passed {state.successes} health checks in a row"
                self._change(state, up=True, reason="")
                state.unwritten = True
                return Change(replica_id, True, reason)
            return None
        state.failures, state.successes = state.failures + 1, 0
        if state.up and state.failures >= self.unhealthy:
            reason = f"failed {state.failures} health checks in a row; last: {error}"
            self._change(state, up=False, reason=reason)
            state.unwritten = True
            return Change(replica_id, False, reason)
        return None

    def _change(self, state: ReplicaHealth, *, up: bool, reason: str) -> None:
        state.up, state.reason, state.since = up, reason, self._clock()
        # Counted afresh from the change: coming back up takes HEALTHY_THRESHOLD
        # successes even after a change heard from the database.
        state.failures = state.successes = 0

    def down_ids(self) -> set[int]:
        return {replica_id for replica_id, state in self.states.items() if not state.up}

    def unwritten(self) -> list[tuple[int, ReplicaHealth]]:
        return [(i, s) for i, s in self.states.items() if s.unwritten]


class HealthChecks:
    """The checking task of one gateway process: `run` until cancelled."""

    def __init__(
        self,
        router: Router,
        *,
        interval: float,
        timeout: float,
        unhealthy: int,
        healthy: int,
    ) -> None:
        self.router = router
        self.interval = max(0.05, interval)
        self.timeout = timeout
        self.book = HealthBook(unhealthy=unhealthy, healthy=healthy)
        # A connection per check, closed after it: a kept-alive one the
        # replica closed while idle would fail a check of a healthy replica.
        self._client = UpstreamClient(keepalive_seconds=0)
        self._writing: asyncio.Task | None = None
        self._checker = f"gateway {socket.gethostname()}"

    @classmethod
    def from_settings(cls, router: Router, cfg: Mapping) -> HealthChecks:
        return cls(
            router,
            interval=cfg["HEALTH_INTERVAL_SECONDS"],
            timeout=cfg["HEALTH_TIMEOUT_SECONDS"],
            unhealthy=cfg["HEALTH_UNHEALTHY_THRESHOLD"],
            healthy=cfg["HEALTH_HEALTHY_THRESHOLD"],
        )

    async def run(self) -> None:
        try:
            while True:
                started = time.monotonic()
                try:
                    await self.check_all()
                except Exception:  # the next round tries again
                    logger.exception("replica health checks failed")
                await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))
        finally:
            if self._writing is not None:
                self._writing.cancel()
            await self._client.close()

    async def check_all(self) -> None:
        """One round: every replica checked at once, then what changed
        applied to routing and metrics at once, and to the database soon."""
        snapshot = self.router.snapshot
        targets = list(snapshot.health_targets)
        changes = self.book.sync({r.id: r.id not in snapshot.down_ids for r in targets})
        errors = await asyncio.gather(*(self.check(r) for r in targets))
        for replica, error in zip(targets, errors, strict=True):
            change = self.book.observe(replica.id, error=error)
            if change is not None:
                changes.append(change)
        self._apply(targets, changes)
        self._write_soon()

    async def check(self, replica: ReplicaInfo) -> str | None:
        """None when the replica's health endpoint answered 2xx in time;
        else what went wrong."""
        path = engine_spec(replica.engine).health_path
        try:
            status, _ = await self._client.get(replica.base_url + path, timeout=self.timeout)
        except TimeoutError:
            if self.router.answered_within(replica.id, self.interval + self.timeout):
                return None  # busy serving, not gone
            return f"GET {path}: no answer within {self.timeout:g} s"
        except Exception as exc:  # whatever kept it from answering is a failed check
            return f"GET {path}: {str(exc) or type(exc).__name__}"
        if not 200 <= status < 300:
            return f"GET {path}: HTTP {status}"
        return None

    def _apply(self, targets: list[ReplicaInfo], changes: list[Change]) -> None:
        self.router.down = self.book.down_ids()
        names = {r.id: r.name for r in targets}
        states = self.book.states
        replicas_up_set({r.name: r.id in states and states[r.id].up for r in targets})
        for change in changes:
            name = names.get(change.replica_id, str(change.replica_id))
            REPLICA_TRANSITIONS.labels(name, "up" if change.up else "down").inc()
            if change.up:
                self.router.suspect_clear(change.replica_id)
                logger.info("replica %s is up again: %s", name, change.reason)
            else:
                logger.warning("replica %s is down: %s", name, change.reason)

    async def written(self) -> None:
        """Until the changes being written now are (or failed to be)."""
        if self._writing is not None and not self._writing.done():
            await asyncio.wait([self._writing])

    def _write_soon(self) -> None:
        """The changes not in the database yet, written in the background:
        a slow database never delays the next round of checks."""
        if self._writing is not None and not self._writing.done():
            return
        pending = self.book.unwritten()
        if pending:
            self._writing = asyncio.create_task(self._write(pending), name="replica-health-write")

    async def _write(self, pending: list[tuple[int, ReplicaHealth]]) -> None:
        for replica_id, state in pending:
            up, since = state.up, state.since
            reason = f"{self._checker}: {state.reason}" if state.reason else ""
            try:
                await orm(
                    _record,
                    replica_id=replica_id,
                    up=up,
                    reason=reason,
                    at=datetime.fromtimestamp(since, tz=UTC),
                )
            except Exception as exc:  # kept unwritten: the next round tries again
                first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                logger.warning("could not record replica %s's health: %s", replica_id, first_line)
                return
            if (state.up, state.since) == (up, since):  # not changed again meanwhile
                state.unwritten = False


def _record(**kwargs) -> bool:
    """Its connection closed after: a change of health is rare, and the
    thread may not run Django again for hours."""
    from django.db import connection

    from serving.services import replica_health_record

    try:
        return replica_health_record(**kwargs)
    finally:
        connection.close()
