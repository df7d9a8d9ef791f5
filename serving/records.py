"""The completed-request record the gateway produces. Where it goes is named
by the SERVING_RECORD_SINK setting (metering's ledger), so serving never
imports metering."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from decimal import Decimal

import orjson
from django.conf import settings
from django.utils.module_loading import import_string

# The longest model name a record carries (the usage ledger's column).
MODEL_NAME_MAX = 200
# The gateway's request ids: "gw-", its process's random half (16 hex), the
# epoch hour the request was received in (6 hex) and the process's count
# (12 hex). The hour lets a request be found by its id alone where raw
# events are kept by hour (the scaled path's store), opening an hour or two.
_GATEWAY_ID = re.compile(r"gw-[0-9a-f]{16}([0-9a-f]{6})[0-9a-f]{12}")


def gateway_request_id(process: str, *, hour: int, number: int) -> str:
    """A request id unique across gateway processes (`process`: 16 hex
    digits, random per process), received in epoch hour `hour`."""
    return f"gw-{process}{hour:06x}{number:012x}"


def request_id_hour(request_id: str) -> int | None:
    """The epoch hour a gateway's request id says it was received in (None:
    not one of the gateway's ids, or one from before they said)."""
    found = _GATEWAY_ID.fullmatch(request_id)
    return int(found[1], 16) if found else None


@dataclass
class CompletedRequest:
    request_id: str
    tenant_id: int
    api_key_id: int | None
    model: str
    received_at: datetime
    ended_at: datetime
    status: str
    http_status: int
    replica_id: int | None = None
    pool_id: int | None = None
    priority: int = 0
    stream: bool = False
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    sent_at: datetime | None = None
    first_token_at: datetime | None = None
    queue_ms: Decimal | None = None  # in vLLM's own queue
    gateway_queue_ms: Decimal | None = None  # in the gateway's queue, before dispatch
    ttft_ms: Decimal | None = None
    generation_ms: Decimal | None = None
    # Whose clock the timeline is (metering's Timing: "engine" or "gateway");
    # None: the engine's when it gave any timing, else the gateway's.
    timing: str | None = None
    # metering's Phase: "whole", or one phase of a disaggregated request
    # ("prefill", "decode"), each phase a record of its own.
    phase: str = "whole"
    error: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)

    def to_bytes(self) -> bytes:
        """The record as JSON (what the gateway's spool keeps): times in
        RFC 3339 with their offset, milliseconds as decimal strings."""
        return orjson.dumps(self, default=str)

    @classmethod
    def from_bytes(cls, data: bytes) -> CompletedRequest:
        """The record `to_bytes` made; ValueError or TypeError if it is none."""
        values = orjson.loads(data)
        for name in _DATETIMES:
            if values.get(name) is not None:
                values[name] = datetime.fromisoformat(values[name])
        for name in _DECIMALS:
            if values.get(name) is not None:
                values[name] = Decimal(values[name])
        return cls(**values)


_DATETIMES = [f.name for f in fields(CompletedRequest) if "datetime" in str(f.type)]
_DECIMALS = [f.name for f in fields(CompletedRequest) if "Decimal" in str(f.type)]

RecordSink = Callable[[Sequence[CompletedRequest]], None]


class SinkUnavailable(Exception):
    """The sink cannot take records now (its log or store is away): the
    gateway keeps the batch in its spool and tries again. The sink says
    so in its own log, once per outage."""


def record_sink() -> RecordSink:
    """The sink named in settings."""
    return import_string(settings.SERVING_RECORD_SINK)
