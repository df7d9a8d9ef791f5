"""A record sink for bench/gateway_hop: the Python side of the gateway's
ledger write (every record validated into its ledger row, as
metering.sink.usage_event_sink does first) with nothing sent to the
database."""

from __future__ import annotations

from collections.abc import Sequence

from metering.choices import EventSource
from metering.ledger import usage_rows_validate
from serving.records import CompletedRequest


def validated_only(records: Sequence[CompletedRequest]) -> None:
    usage_rows_validate(events=[vars(r) for r in records], source=EventSource.GATEWAY)
