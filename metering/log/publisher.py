"""The gateway's record sink on the scaled path (SERVING_RECORD_SINK when
USAGE_LOG_URL is set): each flush of the spool published to the usage
log, a message per partition, and returned only once JetStream has
acknowledged every one, so the spool deletes nothing the log does not
hold (a majority of its replicas).

The recorder calls the sink on a worker thread; the NATS client lives on
an event loop of its own, in a thread, for the life of the process. A log
that cannot be reached, or does not answer in PUBLISH_TIMEOUT_SECONDS, is
SinkUnavailable: the batch stays in the spool and is sent again (the same
records, the same message ids: JetStream keeps one of each)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence

import nats

from core.outages import OutageEpisode
from metering.log.messages import Message, event_messages, messages
from metering.log.stream import LogConfig, connect
from serving.records import CompletedRequest, SinkUnavailable

logger = logging.getLogger(__name__)

USAGE_LOG = OutageEpisode("usage log")


class Publisher:
    def __init__(self, config: LogConfig) -> None:
        self.config = config
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="usage-log", daemon=True
        )
        self._thread.start()
        self._nc: nats.NATS | None = None
        self._js = None
        self.published = 0  # messages acknowledged
        self.duplicates = 0  # acknowledged as already held (a retried flush)

    def publish(self, records: Sequence[CompletedRequest]) -> None:
        """Every record acknowledged by the log, or SinkUnavailable."""
        if records:
            out = messages(records, partitions=self.config.partitions)
            self.send(out, doing="gateway")

    def send(self, out: list[Message], *, doing: str) -> None:
        """`out` acknowledged by the log, or SinkUnavailable."""
        records = sum(m.records for m in out)
        future = asyncio.run_coroutine_threadsafe(self._publish(out), self._loop)
        try:
            future.result(timeout=self.config.publish_timeout * 2 + 5)
        except Exception as exc:
            future.cancel()
            USAGE_LOG.failed(exc, doing=f"{doing} publishing {records} usage records", log=logger)
            raise SinkUnavailable(str(exc)) from exc
        USAGE_LOG.recovered(log=logger)

    async def _publish(self, out: list[Message]) -> None:
        if self._nc is None or self._nc.is_closed:
            self._nc = await connect(self.config, name="gateway")
            self._js = self._nc.jetstream(timeout=self.config.publish_timeout)
        acks = await asyncio.gather(
            *(
                self._js.publish(
                    m.subject,
                    m.payload,
                    timeout=self.config.publish_timeout,
                    stream=self.config.stream,
                    headers=m.headers,
                )
                for m in out
            )
        )
        self.published += len(acks)
        self.duplicates += sum(1 for ack in acks if ack.duplicate)

    def close(self) -> None:
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):  # a log gone: nothing left to drain
                asyncio.run_coroutine_threadsafe(self._nc.drain(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def publisher() -> Publisher:
    """The process's one publisher (made on first use, and again when the
    settings name another log)."""
    global _publisher
    config = LogConfig.from_settings()
    with _publisher_lock:
        if _publisher is not None and _publisher.config != config:
            _publisher.close()
            _publisher = None
        if _publisher is None:
            _publisher = Publisher(config)
        return _publisher


def usage_log_sink(records: Sequence[CompletedRequest]) -> None:
    """SERVING_RECORD_SINK on the scaled path."""
    publisher().publish(records)


def usage_log_events(rows: Sequence[dict]) -> None:
    """Events the ingestion API validated (ledger rows as mappings), to the
    log: acknowledged, or SinkUnavailable (the API answers 503)."""
    if rows:
        p = publisher()
        p.send(event_messages(rows, partitions=p.config.partitions), doing="usage ingestion")
