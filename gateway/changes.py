"""The gateway's ear on core.changes: one PostgreSQL connection LISTENing,
so that a change to what a tenant's requests are held to (credit granted,
a budget raised, a key revoked, a price changed) applies to the next
request, not after the caller cache's TTL, and a change to the fleet (a
replica registered or down) to the next request, not after the fleet's
periodic reload. A lost connection is retried every second; on every
(re)connection everything cached is read again before its next use (kept,
not dropped: the tenants known stay known) and the fleet read again, since
what changed meanwhile was not heard."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from core.changes import CHANNEL, EVERY_TENANT, FLEET

logger = logging.getLogger(__name__)
RETRY_SECONDS = 1.0
# Django's connection parameters psycopg's own connect takes as they are.
_CONNECT_PARAMS = {"dbname", "user", "password", "host", "port", "sslmode", "options"}


def _connect_params() -> dict:
    from django.db import connection

    params = connection.get_connection_params()
    return {k: v for k, v in params.items() if k in _CONNECT_PARAMS}


class ChangesListener:
    def __init__(
        self,
        *,
        on_terms: Callable[[int | None], None],
        on_missed: Callable[[], None],
        on_correction: Callable[[int | None], Awaitable[None]],
        on_fleet: Callable[[], None],
    ) -> None:
        """`on_terms(tenant id or None for all)`; `on_missed()`: changes may
        have gone unheard (read what is cached again); `on_correction(id, or None
        for every correction not applied yet)`; `on_fleet()`: read the
        fleet again."""
        self._on_terms = on_terms
        self._on_missed = on_missed
        self._on_correction = on_correction
        self._on_fleet = on_fleet
        self.listening = False

    async def run(self) -> None:
        import psycopg

        params = await asyncio.to_thread(_connect_params)
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(**params, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {CHANNEL}")
                    self.listening = True
                    self._on_missed()
                    self._on_fleet()
                    await self._on_correction(None)
                    async for note in conn.notifies():
                        await self._heard(note.payload)
            except asyncio.CancelledError:
                raise
            except Exception:  # a lost database: keep serving, try again
                logger.warning("not listening for changes; retrying", exc_info=True)
            self.listening = False
            await asyncio.sleep(RETRY_SECONDS)

    async def _heard(self, payload: str) -> None:
        kind, _, what = payload.partition(":")
        if kind == "terms":
            self._on_terms(None if what == EVERY_TENANT else int(what))
        elif kind == FLEET:
            self._on_fleet()
        elif kind == "correction":
            await self._on_correction(int(what))
