"""bench/gateway_ab: what a change to the gateway bought. Two gateways in
one run, one from a git revision (`--base`, checked out into a temporary
worktree) and one from the working tree, in front of the same instant fake
upstream; the arms take turns in rounds, so the machine's noise falls on
both alike.

    ./dev bench gateway_ab --base HEAD~1 [--rounds 6] [--rate 400] [--seconds 4]

Measured per arm: the gateway's CPU a second while idle (what its timers
and background tasks cost with no request), its CPU per request at a fixed
offered load (`--rate` requests a second, open loop: comparable between
arms, unlike a closed loop's CPU per request, which moves with how many
requests each wake-up of the event loop finds), and the throughput, CPU per request and
latency at the ceiling (64 in flight) and one request at a time. Prints a
table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import psutil  # noqa: E402
from django.conf import settings  # noqa: E402

from bench.common import LoadResult, bench_database, paced, report_write  # noqa: E402
from bench.gateway import (  # noqa: E402
    FAKE_MODEL,
    bench_tenant,
    body,
    cpu_seconds,
    fake_replica_register,
    fake_upstream,
    run,
)
from core.processes import ManagedProcess  # noqa: E402
from tests.services import free_port, redis_url  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def gateway_start(name: str, cwd: Path, *, redis: str = "") -> tuple[ManagedProcess, str]:
    """A gateway run from `cwd`'s code (uvicorn imports the app from the
    directory it starts in); `redis`: the Redis it shares its admission
    limits and spend accounts through (under keys of its own), or none."""
    port = free_port()
    process = ManagedProcess(
        name,
        ["sh", "-c", f'cd "{cwd}" && exec "{sys.executable}" manage.py gateway --port {port}'],
        # The operator port by the environment, which a revision from before
        # the operator listener ignores (and then serves /healthz itself).
        env={
            "REDIS_URL": redis,
            "GATEWAY_REDIS_PREFIX": f"bench-{name}",
            "GATEWAY_OPERATOR_PORT": str(free_port()),
        },
        log_path=Path(settings.VAR_DIR) / "log" / f"bench-{name}.log",
        # Either revision's tenant port answers /healthz once it serves.
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    process.start()
    process.wait_ready(timeout=60)
    return process, f"http://127.0.0.1:{port}/v1/chat/completions"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True, help="the git revision to compare against")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--rate", type=float, default=400)
    parser.add_argument("--seconds", type=float, default=4)
    parser.add_argument("--requests", type=int, default=6000, help="per arm, at the ceiling")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument(
        "--redis",
        action="store_true",
        help="both gateways share admission limits and spend accounts through REDIS_URL's "
        "Redis, as production gateways do (default: in memory)",
    )
    args = parser.parse_args()
    shared = redis_url() if args.redis else ""
    if args.redis and not shared:
        parser.error("--redis: no Redis answers at REDIS_URL")
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    base_rev = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, check=True,
        capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip

    bench_database("bench_gateway_ab")  # a database of its own, migrated
    _tenant, secret = bench_tenant()
    auth = {"Authorization": f"Bearer {secret}"}
    fake, fake_port = fake_upstream(args.tokens)
    worktree = Path(tempfile.mkdtemp(prefix="gateway-ab-")) / "base"
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(worktree), base_rev], cwd=ROOT, check=True
    )
    processes = [fake]
    try:
        fake.start()
        fake.wait_ready(timeout=30)
        fake_replica_register(fake_port)
        arms = {}
        for name, cwd in ((f"base {base_rev}", worktree), ("working tree", ROOT)):
            say(f"starting the gateway of {name} …")
            process, url = gateway_start(f"gateway-ab-{len(arms)}", cwd, redis=shared)
            processes.append(process)
            arms[name] = (url, psutil.Process(process.pid))
        time.sleep(3)  # the fleet refresh picks up the fake replica
        for url, _ in arms.values():
            run("warm", url, model=FAKE_MODEL, tokens=args.tokens, stream=False,
                requests=300, concurrency=32, headers=auth)  # fmt: skip
        direct = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
        say("idle, arms taking turns …")
        idle_cpu = {name: [] for name in arms}
        for n in range(args.rounds):
            for name in list(arms)[n % 2 :] + list(arms)[: n % 2]:
                _, process = arms[name]
                before = cpu_seconds(process)
                time.sleep(args.seconds)
                idle_cpu[name].append((cpu_seconds(process) - before) / args.seconds * 1000)
        rows = []
        for stream in (False, True):
            kind = "stream" if stream else "non-stream"
            say(f"{kind} at {args.rate:.0f} requests/s, arms taking turns …")
            paced_cpu = {name: [] for name in arms}
            for n in range(args.rounds):
                for name in list(arms)[n % 2 :] + list(arms)[: n % 2]:
                    url, process = arms[name]
                    before = cpu_seconds(process)
                    failures = asyncio.run(
                        paced(url, body(FAKE_MODEL, args.tokens, stream), auth,
                              rate=args.rate, seconds=args.seconds)
                    )  # fmt: skip
                    if failures:
                        raise RuntimeError(f"{name}: {failures} requests failed")
                    sent = int(args.rate * args.seconds)
                    paced_cpu[name].append((cpu_seconds(process) - before) / sent * 1e6)
            for concurrency, label in ((64, "ceiling, 64 in flight"), (1, "one at a time")):
                say(f"{kind}, {label}, arms taking turns …")
                requests = args.requests if concurrency > 1 else args.requests // 10
                parts = {name: [] for name in ["direct", *arms]}
                for n in range(args.rounds):
                    order = list(arms)[n % 2 :] + list(arms)[: n % 2]
                    for name in ["direct", *order]:
                        url, process = (direct, None) if name == "direct" else arms[name]
                        before = cpu_seconds(process) if process else 0
                        result = run(name, url, model=FAKE_MODEL, tokens=args.tokens,
                                     stream=stream, requests=requests // args.rounds,
                                     concurrency=concurrency, headers=auth)  # fmt: skip
                        if process:
                            result.server_cpu_seconds = cpu_seconds(process) - before
                        parts[name].append(result)
                merged = {name: LoadResult.merged(p) for name, p in parts.items()}
                rows.append((kind, label, merged, paced_cpu))
    finally:
        for process in reversed(processes):
            process.stop()
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, check=False
        )

    base, new = list(arms)
    lines = [
        f"`{base}` against the working tree"
        + (", each sharing its limits through Redis" if shared else "")
        + ", the same instant fake upstream, "
        f"{args.rounds} rounds with the arms taking turns. CPU: user + system seconds of "
        "every thread of the gateway process per request; at a fixed offered load "
        f"({args.rate:.0f} requests/s, open loop) it compares the arms' own costs. "
        "Throughput and hop: the fake upstream called straight is the floor.",
        "",
        f"| requests | load | {base}: µs CPU / req | working tree: µs CPU / req | "
        f"ratio | {base}: req/s (x floor) | working tree: req/s (x floor) | "
        f"{base}: added p50 / p99 ms | working tree: added p50 / p99 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    a, b = (sum(idle_cpu[name]) / len(idle_cpu[name]) for name in (base, new))
    lines.append(f"| none (idle) | ms CPU a second | {a:.1f} | {b:.1f} | x {b / a:.2f} | | | | |")
    seen_paced = set()
    for kind, label, merged, paced_cpu in rows:
        if kind not in seen_paced:
            seen_paced.add(kind)
            a = sum(paced_cpu[base]) / len(paced_cpu[base])
            b = sum(paced_cpu[new]) / len(paced_cpu[new])
            lines.append(
                f"| {kind} | {args.rate:.0f} req/s | {a:.0f} | {b:.0f} | x {b / a:.2f} | | | | |"
            )
        d, a, b = merged["direct"], merged[base], merged[new]

        def added(r: LoadResult, d: LoadResult = d) -> str:
            return (
                f"+{r.p('e2e_ms', 50) - d.p('e2e_ms', 50):.2f} / "
                f"+{r.p('e2e_ms', 99) - d.p('e2e_ms', 99):.2f}"
            )

        lines.append(
            f"| {kind} | {label} | {a.server_cpu_us_per_request:.0f} | "
            f"{b.server_cpu_us_per_request:.0f} | "
            f"x {b.server_cpu_us_per_request / a.server_cpu_us_per_request:.2f} | "
            f"{a.throughput:,.0f} (x {a.throughput / d.throughput:.2f}) | "
            f"{b.throughput:,.0f} (x {b.throughput / d.throughput:.2f}) | "
            f"{added(a)} | {added(b)} |"
        )
    report_write(
        name="gateway_ab",
        title="What the gateway's last changes bought (bench/gateway_ab.py)",
        command=f"./dev bench gateway_ab --base {args.base} --rounds {args.rounds} "
        f"--rate {args.rate:g} --seconds {args.seconds:g}" + (" --redis" if shared else ""),
        body="\n".join(lines),
    )


if __name__ == "__main__":
    main()
