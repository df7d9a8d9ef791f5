"""One completion request as the gateway's pipeline carries it
(gateway/pipeline.py): the context each stage reads and adds to, from its
authentication to its record, and the refusal a stage ends it with."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.callers import Caller
    from gateway.errors import Refused
    from gateway.fairness import Slot
    from gateway.outcome import Send
    from gateway.payload import Prepared
    from gateway.queueing import ClientWatch, QueueWait
    from gateway.spend import Hold
    from serving.records import CompletedRequest

Receive = Callable[[], Awaitable[dict]]


@dataclass(slots=True, eq=False)
class Exchange:
    """A request from its caller's authentication to its record. Each stage
    fills its part: parsing `prepared`, the spend stage `hold`, the queue
    `wait` and, for each replica tried, `slot`."""

    caller: Caller
    record: CompletedRequest  # what the ledger gets, filled in as it goes
    kind: str  # chat | completion | responses | embeddings (gateway.payload)
    receive: Receive
    send: Send
    rid_header: tuple[bytes, bytes]  # X-Request-Id, on every answer
    disconnected: ClientWatch  # whether the client went away (watched when it matters)
    prepared: Prepared | None = None
    hold: Hold | None = None  # the spend reserved for it, settled when it ends
    wait: QueueWait | None = None  # its time in the gateway's queue
    slot: Slot | None = None  # its place on the replica tried now
    # A disaggregated request's prompt and cached tokens as its prefill
    # counted them (gateway.disagg): what its spend settles to.
    prefill_prompt: tuple[int, int] | None = None


class EndHeld:
    """One request's ASGI send, holding back the message that ends its
    response (the last body) until `release`: the pipeline releases it once
    the request's record is in the spool, so a client never holds a whole
    answer that a gateway killed the moment after could lose. Keeping the
    record is a write to the spool file (no fsync on this path);
    TensorRT-LLM's timings, read from its /perf_metrics before the record
    is made, can hold the end up to that look-up's wait."""

    __slots__ = ("_end", "_send", "_start")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._start: dict | None = None  # the headers, sent with what follows them
        self._end: dict | None = None

    async def __call__(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self._start = message  # a whole answer's head and body leave together
            return
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self._end = message
            return
        await self._head_sent()
        await self._send(message)

    async def _head_sent(self) -> None:
        start, self._start = self._start, None
        if start is not None:
            await self._send(start)

    async def release(self) -> None:
        await self._head_sent()
        end, self._end = self._end, None
        if end is not None:
            await self._send(end)


class Rejected(Exception):
    """A stage turned the request away before it ran anywhere: recorded as
    rejected, then `refused` answered (None: the client is gone, nobody to
    answer). `error`: what the ledger says, by default the code first, so
    availability can tell the platform's queue from a tenant's own limits."""

    def __init__(
        self,
        refused: Refused | None,
        *,
        status: int | None = None,
        error: str | None = None,
        model_label: str | None = None,
    ) -> None:
        super().__init__(error)
        self.refused = refused
        self.status = refused.status if refused is not None else status
        self.error = f"{refused.code}: {refused.message}" if error is None else error
        self.model_label = model_label  # the metrics' label for the model, when not its own
