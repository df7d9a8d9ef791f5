"""TensorRT-LLM's per-request timings, which it keeps apart from its
answers: with `return_perf_metrics` on, trtllm-serve's GET /perf_metrics
returns the timings of the requests finished since it was last read, and
forgets them (serving.engines). Each entry is keyed by the engine's request
id, which a stream's chunks carry in their id (`chatcmpl-<id>`).

So the gateway reads each TensorRT-LLM replica's /perf_metrics when one of
its requests has ended, keeps what it read for a minute (the requests of
others still running), and takes its own. An entry is added when the engine
has finished the request, a moment after its last chunk: the reader tries
again for up to WAIT_SECONDS, the whole look-up included. Past that
(another reader drained it: a second gateway, an operator's script), or at
once from a replica that does not serve /perf_metrics, the request is
recorded with the gateway's own window, and its ledger row says so."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import orjson

from gateway.upstream_http import UpstreamClient, UpstreamError
from serving.engines import NO_TIMINGS, Timings, perf_metrics_timings

logger = logging.getLogger(__name__)

WAIT_SECONDS = 1.0
KEEP_SECONDS = 60.0
# A replica that does not serve /perf_metrics (return_perf_metrics off) is
# not asked again for this long: its requests take the gateway's window at
# once instead of waiting for an entry that will never come.
ABSENT_SECONDS = 60.0


def engine_request_id(answer_id: str) -> str:
    """The engine's request id in an answer's id (`chatcmpl-17` -> `17`)."""
    return answer_id.rsplit("-", 1)[-1]


class PerfMetrics:
    def __init__(
        self,
        session: UpstreamClient,
        *,
        wait_seconds: float = WAIT_SECONDS,
        keep_seconds: float = KEEP_SECONDS,
    ) -> None:
        self._session = session
        self._wait = wait_seconds
        self._keep = keep_seconds
        # Per /perf_metrics URL: request id -> (when read, entry).
        self._read: dict[str, dict[str, tuple[float, dict[str, Any]]]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._absent_until: dict[str, float] = {}
        self.missed = 0  # requests whose entry never came (recorded with the gateway's window)

    async def timings(self, url: str, answer_id: str) -> Timings:
        """The timings of the request whose answer had `answer_id`, from
        the replica's /perf_metrics at `url`; none if it does not show up
        within the wait (which bounds the whole look-up)."""
        try:
            async with asyncio.timeout(self._wait):
                return await self._look_up(url, engine_request_id(answer_id))
        except TimeoutError:
            self.missed += 1
            return NO_TIMINGS

    async def _look_up(self, url: str, key: str) -> Timings:
        pause = 0.02
        while True:
            entry = self._take(url, key)
            if entry is None:
                if self._absent_until.get(url, 0) > time.monotonic():
                    self.missed += 1
                    return NO_TIMINGS
                await self._read_more(url)
                entry = self._take(url, key)
            if entry is not None:
                return perf_metrics_timings(entry)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.25)

    def _take(self, url: str, key: str) -> dict[str, Any] | None:
        found = self._read.get(url, {}).pop(key, None)
        return None if found is None else found[1]

    async def _read_more(self, url: str) -> None:
        """One read at a time per replica: the read drains it."""
        lock = self._locks.setdefault(url, asyncio.Lock())
        async with lock:
            try:
                async with asyncio.timeout(2):
                    resp = await self._session.request(
                        "GET", url, connect_timeout=2, read_timeout=2
                    )
                    try:
                        if resp.status == 404:  # not served: return_perf_metrics is off
                            self._absent_until[url] = time.monotonic() + ABSENT_SECONDS
                        if resp.status != 200:
                            return
                        entries = orjson.loads(await resp.read())
                    finally:
                        resp.release()
            except (UpstreamError, TimeoutError, orjson.JSONDecodeError) as exc:
                logger.warning("could not read %s: %s", url, exc)
                return
            now = time.monotonic()
            held = self._read.setdefault(url, {})
            for entry in entries if isinstance(entries, list) else ():
                if isinstance(entry, dict) and entry.get("request_id") is not None:
                    held[str(entry["request_id"])] = (now, entry)
            for key in [k for k, (at, _) in held.items() if now - at > self._keep]:
                del held[key]  # another gateway's request, or one that never asked
