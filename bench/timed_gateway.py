"""The gateway with its spend hold timed from the inside: SpendGuard's
reserve and settle wrapped, each call's CPU time (time.thread_time: this
thread's, so nothing else on the machine counts) summed. On SIGUSR1 it
writes {"reserve": [seconds, calls], "settle": [...]} to `--out`. For
bench/spend_hold.py: what a held request costs inside a running gateway,
where caches are cold, beside the gateway's whole CPU per request.

    python -m bench.timed_gateway --port 9001 --out /tmp/hold.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

from django.core.management import call_command  # noqa: E402

from gateway.spend import SpendGuard  # noqa: E402


def timed(totals: dict[str, list], name: str) -> None:
    inner = getattr(SpendGuard, name)
    clock = time.thread_time
    total = totals[name] = [0.0, 0]

    async def wrapped(self, *args, **kwargs):
        started = clock()
        result = await inner(self, *args, **kwargs)
        total[0] += clock() - started
        total[1] += 1
        return result

    setattr(SpendGuard, name, wrapped)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    totals: dict[str, list] = {}
    for name in ("reserve", "settle"):
        timed(totals, name)

    def write(*_) -> None:
        with open(args.out, "w") as out:
            json.dump(totals, out)

    signal.signal(signal.SIGUSR1, write)
    call_command("gateway", "--port", str(args.port))


if __name__ == "__main__":
    main()
