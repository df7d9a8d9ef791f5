"""Run one ledger writer of the scaled path (metering.log.writer): it takes
its share of the usage log's partitions into the raw-event store, until
SIGTERM or SIGINT (what it read is committed first)."""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from metering.log.stream import LogConfig
from metering.log.writer import Writer

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = "Write the usage log's events into the raw-event store (USAGE_LOG_URL must be set)."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--id", help="This writer's name among the writers (default: host-pid)."
        )
        parser.add_argument(
            "--alive-file",
            type=Path,
            help="A file touched on every pass of the loop (a liveness probe reads its age).",
        )

    def handle(self, *args, **options) -> None:
        config = LogConfig.from_settings()
        if not config.servers:
            raise CommandError("USAGE_LOG_URL is not set: there is no usage log to write from")
        writer = Writer(config, writer_id=options["id"], alive_file=options["alive_file"])

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            await writer.run(stop)

        logger.info(
            "usage writer %s: writing %s into %s", writer.id, config.stream, config.store_url
        )
        asyncio.run(main())
        s = writer.stats
        logger.info(
            "usage writer %s: stopped after %d events in %d commits (%d dead-lettered)",
            writer.id,
            s.events,
            s.commits,
            s.invalid,
        )
