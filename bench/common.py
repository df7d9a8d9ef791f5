"""Shared by the benchmarks: an async HTTP load generator, percentiles, and
writing a result table into docs/benchmarks.md (one section per benchmark,
replaced on each run, with the machine and the date)."""

from __future__ import annotations

import asyncio
import os
import platform
import re
import statistics
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "docs" / "benchmarks.md"


@dataclass
class LoadResult:
    label: str
    requests: int
    errors: int
    wall_seconds: float
    ttft_ms: list[float] = field(default_factory=list)  # ok-float: timings
    e2e_ms: list[float] = field(default_factory=list)  # ok-float: timings
    timeline: list[tuple[float, float]] = field(default_factory=list)  # (start s, e2e ms)
    # CPU seconds (user + system, every thread) the server under test spent
    # on this load, when the bench measured it: its cost per request does not
    # depend on what else shares the cores, unlike the throughput.
    server_cpu_seconds: float = 0.0  # ok-float: timings
    # Its resident memory after the load (the most of any part).
    server_rss_mib: float = 0.0  # ok-float: MiB
    # A gateway's event-loop lag over the load, counted by the bounds of
    # gateway.stalls.LAG_BOUNDS_MS (empty: not measured).
    lag_counts: list[int] = field(default_factory=list)
    first_error: str = ""  # the first failed request's status and body (or exception)

    @property
    def throughput(self) -> float:
        return (self.requests - self.errors) / self.wall_seconds

    @classmethod
    def merged(cls, parts: list[LoadResult]) -> LoadResult:
        """One arm's rounds as one result (throughput over their summed time)."""
        return cls(
            label=parts[0].label,
            requests=sum(p.requests for p in parts),
            errors=sum(p.errors for p in parts),
            wall_seconds=sum(p.wall_seconds for p in parts),
            ttft_ms=[v for p in parts for v in p.ttft_ms],
            e2e_ms=[v for p in parts for v in p.e2e_ms],
            server_cpu_seconds=sum(p.server_cpu_seconds for p in parts),
            server_rss_mib=max(p.server_rss_mib for p in parts),
            lag_counts=[sum(c) for c in zip(*(p.lag_counts for p in parts), strict=True)]
            if all(p.lag_counts for p in parts)
            else [],
            first_error=next((p.first_error for p in parts if p.first_error), ""),
        )

    @property
    def server_cpu_us_per_request(self) -> float:
        return self.server_cpu_seconds / max(1, self.requests - self.errors) * 1e6

    def p(self, which: str, q: float) -> float:
        values = sorted(getattr(self, which))
        if not values:
            return float("nan")
        index = min(len(values) - 1, round(q / 100 * (len(values) - 1)))
        return values[index]


async def load(
    label: str,
    url: str,
    *,
    body: bytes,
    headers: dict[str, str],
    requests: int,
    concurrency: int,
    stream: bool,
) -> LoadResult:
    """`requests` POSTs with `concurrency` in flight; time to first body byte
    (first SSE event when streaming) and to the end of the body."""
    result = LoadResult(label=label, requests=requests, errors=0, wall_seconds=0.0)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in range(requests):
        queue.put_nowait(n)
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(
        connector=connector,
        timeout=timeout,
        headers={"Content-Type": "application/json", **headers},
    ) as session:
        began = time.perf_counter()

        async def worker() -> None:
            while not queue.empty():
                queue.get_nowait()
                started = time.perf_counter()
                try:
                    async with session.post(url, data=body) as response:
                        first, head = None, b""
                        async for chunk in response.content.iter_any():
                            if first is None:
                                first = time.perf_counter()
                            if response.status != 200 and len(head) < 300:
                                head += chunk
                        if response.status != 200:
                            result.errors += 1
                            result.first_error = result.first_error or (
                                f"{response.status} {head[:300].decode(errors='replace')}"
                            )
                            continue
                except aiohttp.ClientError as exc:
                    result.errors += 1
                    result.first_error = result.first_error or repr(exc)
                    continue
                ended = time.perf_counter()
                result.ttft_ms.append(((first or ended) - started) * 1000)
                result.e2e_ms.append((ended - started) * 1000)
                result.timeline.append((started - began, (ended - started) * 1000))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        result.wall_seconds = time.perf_counter() - began
    return result


async def paced(url: str, payload: bytes, headers: dict, *, rate: float, seconds: float) -> int:
    """Open loop: a request every 1/rate s for `seconds`, each read to its
    end; the number of failures."""
    failures = 0
    async with aiohttp.ClientSession(headers={"Content-Type": "application/json", **headers}) as s:

        async def one() -> None:
            nonlocal failures
            try:
                async with s.post(url, data=payload) as response:
                    async for _chunk in response.content.iter_any():
                        pass
                    failures += response.status != 200
            except aiohttp.ClientError:
                failures += 1

        tasks, began = [], time.perf_counter()
        for n in range(int(rate * seconds)):
            delay = began + n / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return failures


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(re.search(r"MemTotal:\s+(\d+)", Path("/proc/meminfo").read_text())[1])
        mem = f"{mem_kb / 1024 / 1024:.0f} GiB"
    except OSError:
        mem = "?"
    system = f"{platform.system()} {platform.release()}"
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem} RAM, {system}, Python {platform.python_version()}"
    )


def report_write(*, name: str, title: str, command: str, body: str, results=()) -> None:
    """Print the table and replace this benchmark's section in docs/benchmarks.md;
    `results` (its arms' LoadResults) must have met no error (arms_check)."""
    arms_check(results)
    print("\n" + body.strip(), flush=True)
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = (
        f"<!-- bench:{name} -->\n## {title}\n\n`{command}` — {stamp}\n\n"
        f"Machine: {machine()}\n\n{body.strip()}\n<!-- /bench:{name} -->\n"
    )
    text = (
        REPORT.read_text()
        if REPORT.exists()
        else (
            "# Benchmarks\n\nWritten by the benchmarks themselves (`./dev bench NAME`); "
            "each section is replaced when its benchmark runs again.\n\n"
        )
    )
    pattern = re.compile(rf"<!-- bench:{name} -->.*?<!-- /bench:{name} -->\n", re.S)
    text = pattern.sub(section, text) if pattern.search(text) else text + "\n" + section
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(text)


class PeakRss:
    """This process's peak resident memory, sampled every 20 ms while in
    use (ru_maxrss would carry a parent's high-water mark over exec).
    `take()` returns the peak so far in MiB and starts a new one."""

    def __init__(self) -> None:
        import threading

        import psutil

        self._me = psutil.Process()
        self._peak = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._done.wait(0.02):
            self._peak = max(self._peak, self._me.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()

    def take(self) -> float:
        peak, self._peak = self._peak, 0
        return peak / 2**20


def median(values: list[float]) -> float:  # ok-float: timings
    return statistics.median(values) if values else float("nan")


def fleet_remove(prefix: str) -> None:
    """Delete a benchmark's fleet: every row whose name starts with `prefix`."""
    from serving.models import Gpu, GpuSku, Node, Pool, Replica, Reservation, ServedModel

    Reservation.objects.filter(pool__name__startswith=prefix).delete()
    Replica.objects.filter(name__startswith=prefix).delete()
    Gpu.objects.filter(serial__startswith=prefix).delete()
    Pool.objects.filter(name__startswith=prefix).delete()
    Node.objects.filter(name__startswith=prefix).delete()
    GpuSku.objects.filter(name__startswith=prefix).delete()
    ServedModel.objects.filter(name__startswith=prefix).delete()


def database_switch(name: str, *, create: bool = False, template: str | None = None) -> str:
    """Point this process at database `name` on the same server, made afresh
    when asked (empty, or a copy of `template`; this process must not be on
    `name` then); returns its URL for the processes a bench starts."""
    from django.db import connection, connections

    from core.processes import database_url_for_subprocess

    url = database_url_for_subprocess(name=name)
    if create:
        copy = f' TEMPLATE "{template}"' if template else ""
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            cursor.execute(f'CREATE DATABASE "{name}"{copy}')
    connections["default"].close()
    connections["default"].settings_dict["NAME"] = name
    return url


def bench_database(name: str) -> str:
    """This bench on a database of its own (`name`, made afresh and migrated;
    dropped, and this process back on its own, when it exits), whatever
    the database `./dev up` or another bench left: a demo's price book or
    tenants never meet the bench's. Returns its URL for the processes the
    bench starts (they read it from the connection too)."""
    import atexit

    from django.core.management import call_command
    from django.db import connections

    home = connections["default"].settings_dict["NAME"]
    url = database_switch(name, create=True)
    call_command("migrate", verbosity=0)

    def back() -> None:
        database_switch(home)
        databases_drop(name)

    atexit.register(back)
    return url


class BenchFailed(SystemExit):
    """A bench whose arms met errors: nothing written."""


def arms_check(results) -> None:
    """Every arm answered without error, or BenchFailed naming each arm
    that did not and its first error (before anything is written)."""
    failed = [r for r in results if r.errors]
    if failed:
        lines = [
            f"  {r.label}: {r.errors} of {r.requests} failed; first: {r.first_error}"
            for r in failed
        ]
        raise BenchFailed("the bench's arms met errors, nothing written:\n" + "\n".join(lines))


def databases_drop(*names: str) -> None:
    """Drop a bench's own databases (this process on another one)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def database_settle(*tables: str) -> bool:
    """Settle the database before a timed part: `tables`' dead rows
    vacuumed and statistics fresh, and (where we may) a checkpoint taken,
    so that runs compare with each other. False when the checkpoint was
    not allowed (not a superuser: it only steadies the timing)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for table in tables:
            cursor.execute(f"VACUUM ANALYZE {table}")
        try:
            cursor.execute("CHECKPOINT")
        except Exception:
            return False
    return True


def collector_lines(logs: Path) -> dict[Path, int]:
    """How many collections each worker has logged so far in `logs`
    (bench.collector_timed_asgi), to read only what comes after."""
    return {log: len(log.read_text().splitlines()) for log in logs.iterdir()}


def collector_read(logs: Path, *, after: dict[Path, int] | None = None) -> dict:
    """The collections bench.collector_timed_asgi's workers logged in
    `logs` (after `after`, from collector_lines): how many were full, their
    total ms, and the longest of any generation."""
    after = after or {}
    timed = [
        line.split()
        for log in logs.iterdir()
        for line in log.read_text().splitlines()[after.get(log, 0) :]
    ]
    full = [float(ms) for generation, ms in timed if generation == "2"]
    return {
        "full": len(full),
        "full_ms": sum(full),
        "longest": max((float(ms) for _, ms in timed), default=0.0),
    }


def collector_table(arms: dict[str, dict]) -> list[str]:
    """A markdown table of each arm's collector_read figures."""
    return [
        "| web worker | full collections | their total ms | longest pause ms |",
        "|---|---|---|---|",
    ] + [
        f"| {arm} | {c['full']} | {c['full_ms']:,.0f} | {c['longest']:,.1f} |"
        for arm, c in arms.items()
    ]
