"""The gateway's record sink (settings.SERVING_RECORD_SINK): completed
requests go straight into the usage ledger."""

from __future__ import annotations

from collections.abc import Sequence

from metering.choices import EventSource
from metering.ledger import usage_record_batch
from serving.records import CompletedRequest


def usage_event_sink(records: Sequence[CompletedRequest]) -> None:
    """Record a flush of the gateway's buffer. A retried flush is harmless
    (request ids already recorded are skipped); an invalid record rejects
    the batch, and the gateway's recorder then retries record by record and
    dead-letters the bad one."""
    usage_record_batch(events=[vars(r) for r in records], source=EventSource.GATEWAY)
