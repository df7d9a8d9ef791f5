"""A server process's heap and the cyclic garbage collector.

Everything a server loads at startup (Django, its apps, the URLconf and
every view it names, DRF, the schema) lives until the process ends. Left
in the collector's generations, each full collection walks all of it: in
a web worker about 175,000 objects, 90-150 ms on the 2-core machine, a
pause for every request that worker is serving (docs/benchmarks.md, "The
web app's collector pauses"). Frozen (`gc.freeze`), they move to a
permanent generation no collection walks, and a full collection then
walks what the requests in flight hold: 10-35 ms measured, on a machine
whose cores the worker shares with its clients and the database."""

from __future__ import annotations

import gc
import time


def startup_heap_freeze() -> None:
    """Collect once, then keep everything alive now out of every later
    collection. Call it once a server has loaded what it keeps for its
    whole life, before it serves."""
    gc.collect()
    gc.freeze()


def web_app_heap_freeze() -> None:
    """For a web worker (config.asgi, config.wsgi): load what Django loads
    on its first request (the URLconf, every view and serializer it names),
    then freeze it all before the worker serves."""
    from django.urls import get_resolver

    get_resolver().url_patterns  # noqa: B018 (imports the URLconf)
    startup_heap_freeze()


class CollectorPauses:
    """The collector's pauses in this process, as `gc.callbacks` sees
    them: the longest, and how many full collections and how long they
    took in all (seconds)."""

    def __init__(self) -> None:
        self.longest = 0.0  # ok-float: seconds, a health statistic
        self.last = 0.0  # ok-float: seconds
        self.full = 0
        self.full_seconds = 0.0  # ok-float: seconds
        self._started = 0.0  # ok-float: perf_counter

    def install(self) -> CollectorPauses:
        gc.callbacks.append(self._on_collection)
        return self

    def _on_collection(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.last = took = time.perf_counter() - self._started
        self.longest = max(self.longest, took)
        if info["generation"] == 2:
            self.full += 1
            self.full_seconds += took
