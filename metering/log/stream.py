"""The usage log's JetStream stream and the writers' lease bucket: their
configuration from settings.USAGE_LOG, made or brought up to date by
whoever starts first (a writer, `manage.py usage_log setup`); a gateway
only publishes (a stream not there yet is the log being unavailable: its
spool holds the records).

Durability (NATS 2.9, what Debian ships): a message is acknowledged once
a majority of the stream's replicas hold it, and reaches their disks at
the server's periodic sync (fsync per write is 2.10's sync_interval).
Losing a majority of nodes at once, power and all, can lose the last
seconds acknowledged; losing one node loses nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

import nats
from django.conf import settings
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from metering.log.messages import SUBJECTS

logger = logging.getLogger(__name__)

LEASES_BUCKET = "usage_writers"
DUPLICATE_WINDOW_SECONDS = 120


@dataclass(frozen=True)
class LogConfig:
    servers: list[str]
    stream: str
    partitions: int
    replicas: int
    max_age_seconds: int
    publish_timeout: float  # ok-float: seconds
    store_url: str
    lease_seconds: float  # ok-float: seconds
    commit_seconds: float  # ok-float: seconds
    commit_events: int
    dead_letter_dir: str

    @classmethod
    def from_settings(cls, cfg: Mapping | None = None) -> LogConfig:
        """settings.USAGE_LOG's, or `cfg`'s (the same keys)."""
        cfg = settings.USAGE_LOG if cfg is None else cfg
        return cls(
            servers=[s.strip() for s in cfg["URL"].split(",") if s.strip()],
            stream=cfg["STREAM"],
            partitions=cfg["PARTITIONS"],
            replicas=cfg["REPLICAS"],
            max_age_seconds=cfg["MAX_AGE_HOURS"] * 3600,
            publish_timeout=cfg["PUBLISH_TIMEOUT_SECONDS"],
            store_url=cfg["STORE_URL"],
            lease_seconds=cfg["LEASE_SECONDS"],
            commit_seconds=cfg["COMMIT_SECONDS"],
            commit_events=cfg["COMMIT_EVENTS"],
            dead_letter_dir=cfg["DEAD_LETTER_DIR"],
        )

    def stream_config(self) -> StreamConfig:
        return StreamConfig(
            name=self.stream,
            subjects=[SUBJECTS],
            num_replicas=self.replicas,
            storage=StorageType.FILE,
            retention=RetentionPolicy.LIMITS,
            discard=DiscardPolicy.OLD,
            max_age=float(self.max_age_seconds),  # ok-float: seconds, as nats-py takes them
            duplicate_window=float(DUPLICATE_WINDOW_SECONDS),  # ok-float: seconds
        )


async def connect(config: LogConfig, *, name: str) -> nats.NATS:
    """A client of the cluster that reconnects for ever (any node will do).
    Its reconnect attempts are quiet (the caller says an outage once, in
    its own words): the client's default logs every refused connection
    with its traceback, twice a second per server."""

    async def error(exc: Exception) -> None:
        logger.debug("%s: usage log client: %s", name, exc)

    async def disconnected() -> None:
        if not (client.is_closed or client.is_draining):  # not our own close
            logger.info("%s: disconnected from the usage log; reconnecting", name)

    async def reconnected() -> None:
        logger.info("%s: reconnected to the usage log at %s", name, client.connected_url.netloc)

    client = await nats.connect(
        servers=config.servers,
        name=name,
        max_reconnect_attempts=-1,
        reconnect_time_wait=0.5,
        connect_timeout=2,
        allow_reconnect=True,
        error_cb=error,
        disconnected_cb=disconnected,
        reconnected_cb=reconnected,
    )
    return client


async def stream_ensure(js, config: LogConfig, *, attempts: int = 30) -> None:
    """The stream as configured: made, or updated in place (a change of
    partitions is refused: the subjects are fixed once it holds usage)."""
    wanted = config.stream_config()
    for attempt in range(attempts):
        try:
            try:
                info = await js.stream_info(config.stream)
            except NotFoundError:
                await js.add_stream(wanted)
                logger.info(
                    "usage log: stream %s made (%d replicas)", config.stream, config.replicas
                )
                return
            if (info.config.num_replicas, info.config.max_age) != (
                wanted.num_replicas,
                wanted.max_age,
            ):
                await js.update_stream(wanted)
            return
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, BadRequestError) as exc:
            # No meta leader yet (a cluster starting, or electing one).
            if attempt == attempts - 1:
                raise
            logger.debug("usage log: stream not ready (%s), trying again", exc)
            await asyncio.sleep(0.5)


async def leases_bucket(js, config: LogConfig):
    """The writers' leases: a key per partition, gone `lease_seconds` after
    its holder last renewed it (the bucket's TTL)."""
    try:
        return await js.key_value(LEASES_BUCKET)
    except (NotFoundError, nats.js.errors.BucketNotFoundError):
        return await js.create_key_value(
            KeyValueConfig(
                bucket=LEASES_BUCKET,
                ttl=config.lease_seconds,
                history=1,
                replicas=config.replicas,
            )
        )
