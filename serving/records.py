"""The completed-request record the gateway produces, and the interim sink
that stores it (metering's ledger replaces the sink through the
SERVING_RECORD_SINK setting; serving never imports metering)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.utils.module_loading import import_string


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
    queue_ms: Decimal | None = None
    ttft_ms: Decimal | None = None
    generation_ms: Decimal | None = None
    error: str = ""
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


RecordSink = Callable[[Sequence[CompletedRequest]], None]


def record_sink() -> RecordSink:
    """The sink named in settings."""
    return import_string(settings.SERVING_RECORD_SINK)


RECORD_COLUMNS = (
    "request_id",
    "tenant_id",
    "api_key_id",
    "model",
    "replica_id",
    "pool_id",
    "priority",
    "stream",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "received_at",
    "sent_at",
    "first_token_at",
    "ended_at",
    "queue_ms",
    "ttft_ms",
    "generation_ms",
    "status",
    "http_status",
    "error",
)


def request_record_sink(records: Sequence[CompletedRequest]) -> None:
    """Interim sink: one RequestRecord row per request, through COPY; a
    request id seen before is skipped (a retried flush never duplicates)."""
    from config.db_copy import copy_insert_ignoring_conflicts
    from serving.models import RequestRecord

    copy_insert_ignoring_conflicts(
        table=RequestRecord._meta.db_table,
        columns=RECORD_COLUMNS,
        rows=(
            tuple(r.error[:300] if c == "error" else getattr(r, c) for c in RECORD_COLUMNS)
            for r in records
        ),
        conflict=("request_id",),
    )
