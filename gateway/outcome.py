"""What one attempt at a replica came to (Outcome), what stops one that
is running (Cut), what says another replica may be tried
(UpstreamUnavailable), and the clock and number helpers the request path
shares."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Protocol

from gateway.errors import Refused
from serving.engines import NO_TIMINGS, Timings

if TYPE_CHECKING:
    from gateway.upstream import UpstreamCall

Send = Callable[[dict], Awaitable[None]]


class Gone(Protocol):
    """Whether the client went away (gateway.queueing.ClientWatch, or an
    asyncio.Event)."""

    def is_set(self) -> bool: ...


def now() -> datetime:
    """django.utils.timezone.now() without its settings look-up on every
    call (USE_TZ is on): the hot path asks the time several times a request."""
    return datetime.now(UTC)


class Cut:
    """Stops a running request (its GPU-second grant was not renewed,
    gateway.spend): the refusal its client gets, and the upstream
    connection closed, which ends vLLM's work on it."""

    def __init__(self) -> None:
        self.refused: Refused | None = None  # once fired
        self.fired_at: datetime | None = None
        self._closers: list[Callable[[], None]] = []

    @property
    def fired(self) -> bool:
        return self.refused is not None

    def fire(self, refused: Refused) -> None:
        self.refused = refused
        self.fired_at = now()
        for close in self._closers:
            close()

    def on_fire(self, close: Callable[[], None]) -> None:
        if self.fired:
            close()
        else:
            self._closers.append(close)


class UpstreamUnavailable(Exception):
    """Nothing was sent to the client; another replica may be tried.
    `replica_fault`: the replica failed (it is then marked suspect), not
    something around it (a disaggregated pool with no decode replica)."""

    def __init__(self, reason: str, *, connection_failed: bool, replica_fault: bool = True) -> None:
        super().__init__(reason)
        self.connection_failed = connection_failed
        self.replica_fault = replica_fault


@dataclass
class Outcome:
    http_status: int
    status: str  # ok | aborted | error
    sent_at: datetime
    first_token_at: datetime | None = None
    usage: dict[str, Any] = field(default_factory=dict)
    timings: Timings = NO_TIMINGS  # the engine's own, where it gave them
    error: str = ""
    # When the replica's work on it ended as the gateway saw it (the ledger's
    # ended_at): the last chunk relayed, the upstream closed on an abort, or
    # the moment it was cut, however long the relay then took to finish.
    upstream_ended_at: datetime | None = None
    # A Responses API request that ended before its usage: the call whose
    # prompt is still to count (prompt_counted), once its slot is given back.
    prompt_uncounted: UpstreamCall | None = None
    # The id the engine gave the answer (its chunks' `id`): TensorRT-LLM's
    # timings are looked up by it (gateway.perf_metrics).
    engine_id: str = ""
    perf_metrics_url: str = ""  # where they are (its replica's /perf_metrics)


def cut_outcome(outcome: Outcome, cut: Cut) -> Refused:
    refused = cut.refused
    outcome.status, outcome.http_status = "aborted", refused.status
    outcome.error = f"{refused.code}: {refused.message}"
    return refused


def describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out waiting for the model server"
    return f"{type(exc).__name__}: {exc}"[:300]


def ms(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value)).quantize(Decimal("0.001"))
