"""A server's startup heap kept out of the collector's full passes
(core.heap): the web app's workers and the gateway freeze what they load
before they serve, so a full collection walks only what requests hold."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import pytest

from core.heap import CollectorPauses

# In a fresh interpreter: what the collector would walk once the web app's
# module is loaded, as a worker (uvicorn's, or a WSGI server's) loads it.
WEB_WORKER = """
import gc, json
import config.ENTRY
from django.urls import get_resolver
import metering.api.views as views
walked = {id(o) for o in gc.get_objects()}
print(json.dumps({
    "frozen": gc.get_freeze_count(),
    "walked": len(walked),
    "resolver_walked": id(get_resolver()) in walked,
    "view_walked": id(views.__dict__) in walked,
}))
"""


@pytest.mark.parametrize("entry", ["asgi", "wsgi"])
def test_a_web_worker_freezes_what_it_loads_before_it_serves(entry):
    out = subprocess.run(
        [sys.executable, "-c", WEB_WORKER.replace("ENTRY", entry)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ,
        timeout=120,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # Django, every app, the URLconf and its views: tens of thousands of
    # objects that no full collection walks again.
    assert found["frozen"] > 50_000
    assert not found["resolver_walked"]
    assert not found["view_walked"]
    # What is left to walk is what the module made after the freeze.
    assert found["walked"] < found["frozen"] / 100


def test_collector_pauses_counts_full_collections_and_the_longest():
    pauses = CollectorPauses().install()
    try:
        garbage = [[]]
        garbage[0].append(garbage)  # a cycle only the collector frees
        del garbage
        gc.collect()
    finally:
        gc.callbacks.remove(pauses._on_collection)
    assert pauses.full == 1
    assert pauses.full_seconds > 0
    assert pauses.longest >= pauses.last > 0
