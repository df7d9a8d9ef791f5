"""bench/ingest: how fast usage becomes durable, and how fast it is attributed.

    ./dev bench ingest [--events 200000] [--api-events 100000] [--attribute-events 1000000]

1. Through the service (`usage_record_batch`: validation streamed into the
   ledger's COPY, the keys' COPY, stale-window marks), in batches like a
   busy gateway's flushes; validation alone; and two floors for the same
   rows, validated beforehand: a raw COPY into a temporary table, and a
   COPY into the ledger and the key table (what durability costs).
2. Through the REST API: 1,000-event JSON batches POSTed by concurrent
   clients to the web app served by uvicorn, authenticated by a service key;
   twice, the web app as deployed and with its workers' startup heap left
   in the collector's care (as before core.heap), with the workers'
   collector pauses.
3. Attribution of a day of 1 M events on 10 replicas (240 replica-hour
   windows), then the rollups of those hours.

The events are synthetic, in January 2001 (a month no real usage touches);
the benchmark removes them afterwards. Prints a table and writes it to
docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import resource
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import django

from bench.common import bench_database

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import aiohttp  # noqa: E402
import orjson  # noqa: E402
from django.db import connection, transaction  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench.common import (  # noqa: E402
    PeakRss,
    collector_lines,
    collector_read,
    collector_table,
    report_write,
)
from core.db_copy import copy_into, copy_to_staging  # noqa: E402
from core.processes import ManagedProcess, uvicorn_argv  # noqa: E402
from metering.choices import EventSource  # noqa: E402
from metering.ledger import (  # noqa: E402
    KEY_COLUMNS,
    KEY_TABLE,
    KEY_TYPES,
    RECEIVED_AT,
    key_rows,
    usage_record_batch,
    usage_rows_validate,
)
from metering.partitions import LEDGER_TABLE, usage_partitions_ensure  # noqa: E402
from metering.validation import LEDGER_COLUMNS, LEDGER_TYPES  # noqa: E402
from serving.models import Pool, Replica  # noqa: E402
from serving.services import (  # noqa: E402
    local_gpu_ensure,
    pool_ensure,
    replica_register,
    served_model_ensure,
)
from serving.tiny_model import model_config  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import service_key_create, tenant_create  # noqa: E402
from tests.services import free_port  # noqa: E402

EPOCH = datetime(2001, 1, 1, tzinfo=UTC)
DURABLE_FLOOR = "floor: the same rows COPYed into the ledger, keys into the key table, nothing else"
TENANTS = 50
REPLICAS = 10
# The model of the benchmark's fleet, served by nothing else: its replicas
# have no server behind them (usage arrives pre-made), and a run stopped
# halfway leaves them registered, where a gateway routing the tiny model
# would have sent requests to them (bench/gateway's vLLM rows did).
MODEL = "bench-ingest"


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_fleet() -> tuple[list[int], list[int]]:
    tenants = []
    for n in range(TENANTS):
        slug = f"bench-ingest-{n}"
        tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(
            name=f"Bench ingest {n}", slug=slug
        )
        tenants.append(tenant.pk)
    model = served_model_ensure(name=MODEL, config=model_config())
    pool = pool_ensure(name="bench-ingest")
    replicas = [
        replica_register(
            name=f"bench-ingest-{n}",
            base_url=f"http://127.0.0.1:{9 + n}",  # never called: events arrive pre-made
            model=model,
            pool=pool,
            gpus=[local_gpu_ensure(serial=f"bench-ingest-gpu-{n}")],
        ).pk
        for n in range(REPLICAS)
    ]
    return tenants, replicas


def events(prefix: str, count: int, *, tenants, replicas, span: timedelta, seed: int = 7):
    """`count` completed requests spread over `span` from EPOCH: 20-2,000
    prompt tokens, 1-400 completion tokens, realistic vLLM timings."""
    rng = random.Random(seed)  # noqa: S311 (synthetic load, not secrets)
    span_us = int(span.total_seconds() * 1_000_000)
    out = []
    # Requests reach the ledger roughly in the order they arrive, as from a gateway.
    offsets = sorted(rng.randrange(span_us) for _ in range(count))
    for i in range(count):
        start = EPOCH + timedelta(microseconds=offsets[i])
        queue, ttft = rng.uniform(0, 50), rng.uniform(5, 200)
        completion = rng.randint(1, 400)
        generation = completion * rng.uniform(8, 30)
        total_ms = queue + ttft + generation + rng.uniform(0.2, 2)
        prompt = rng.randint(20, 2000)
        out.append(
            {
                "request_id": f"{prefix}-{i}",
                "tenant_id": tenants[i % len(tenants)],
                "model": MODEL,
                "replica_id": replicas[i % len(replicas)],
                "priority": 50,
                "stream": bool(i % 2),
                "prompt_tokens": prompt,
                "cached_tokens": rng.randint(0, prompt // 2),
                "completion_tokens": completion,
                "received_at": start,
                "sent_at": start + timedelta(microseconds=300),
                "first_token_at": start + timedelta(milliseconds=queue + ttft),
                "ended_at": start + timedelta(milliseconds=total_ms),
                "queue_ms": Decimal(f"{queue:.3f}"),
                "ttft_ms": Decimal(f"{ttft:.3f}"),
                "generation_ms": Decimal(f"{generation:.3f}"),
                "status": "ok",
                "http_status": 200,
                "synthetic": True,
            }
        )
    return out


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - started, result


def in_batches(items, size):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def through_service(batch_events, *, batch: int) -> float:
    seconds = 0.0
    for chunk in tqdm(list(in_batches(batch_events, batch)), desc="service", leave=False):
        took, _ = timed(usage_record_batch, events=chunk, source=EventSource.API)
        seconds += took
    return seconds


def _writer(args) -> float:
    """One writer process: its share of the events, batch by batch."""
    chunk, batch, barrier = args
    connection.close()  # never share the parent's connection across fork
    connection.ensure_connection()
    barrier.wait()
    started = time.perf_counter()
    for part in in_batches(chunk, batch):
        usage_record_batch(events=part, source=EventSource.API)
    return time.perf_counter() - started


def through_service_parallel(batch_events, *, batch: int, writers: int) -> float:
    """`writers` processes at once, like several gateways flushing: wall time
    from the moment all are connected until the last one is done."""
    ctx = multiprocessing.get_context("fork")
    connection.close()
    barrier = ctx.Manager().Barrier(writers + 1)
    share = -(-len(batch_events) // writers)
    parts = [batch_events[i : i + share] for i in range(0, len(batch_events), share)]
    with ctx.Pool(writers) as pool:
        pending = pool.map_async(_writer, [(p, batch, barrier) for p in parts])
        barrier.wait()
        started = time.perf_counter()
        pending.get()
        return time.perf_counter() - started


def validation_only(batch_events, *, batch: int) -> float:
    seconds = 0.0
    for chunk in in_batches(batch_events, batch):
        took, _ = timed(usage_rows_validate, events=chunk, source=EventSource.API)
        seconds += took
    return seconds


def durable_copy(batch_events, *, batch: int) -> float:
    """The floor of a durable write: the same rows, validated beforehand
    (not timed), COPYed as the service COPYs them into the ledger itself
    (its partition's indexes, checks and WAL) and their keys into the key
    table, a transaction a batch, and nothing else: no validation, no
    stale marks, no look-ups."""

    def write(raw, chunk) -> None:
        copy_into(raw, table=LEDGER_TABLE, columns=LEDGER_COLUMNS, rows=chunk, types=LEDGER_TYPES)
        copy_into(raw, table=KEY_TABLE, columns=KEY_COLUMNS, rows=key_rows(chunk), types=KEY_TYPES)

    rows = usage_rows_validate(events=batch_events, source=EventSource.API)
    usage_partitions_ensure(months={row[RECEIVED_AT] for row in rows})
    return _copies_timed(rows, batch=batch, write=write)


def raw_copy(batch_events, *, batch: int) -> float:
    """The floor of the service's own path: the same rows, validated
    beforehand (not timed), COPYed as the service COPYs them (binary, in
    batches, a transaction each) into a temporary table shaped like the
    ledger, and nothing else: no claim, no move into the ledger, no marks."""

    def write(raw, chunk) -> None:
        copy_to_staging(
            raw, table=LEDGER_TABLE, columns=LEDGER_COLUMNS, rows=chunk, types=LEDGER_TYPES
        )

    rows = usage_rows_validate(events=batch_events, source=EventSource.API)
    return _copies_timed(rows, batch=batch, write=write)


def _copies_timed(rows, *, batch: int, write) -> float:
    """Seconds `write(raw cursor, chunk)` took over `rows` in batches, a
    transaction each."""
    seconds = 0.0
    for chunk in in_batches(rows, batch):
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            write(cursor.cursor, chunk)
        seconds += time.perf_counter() - started
    return seconds


async def post_all(url: str, secret: str, bodies: list[bytes], concurrency: int) -> float:
    queue: asyncio.Queue[bytes] = asyncio.Queue()
    for body in bodies:
        queue.put_nowait(body)
    headers = {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"}
    failures = []
    async with aiohttp.ClientSession(headers=headers) as session:
        started = time.perf_counter()

        async def worker():
            while not queue.empty():
                body = queue.get_nowait()
                async with session.post(url, data=body) as response:
                    if response.status != 200:
                        failures.append(await response.text())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} API batches failed, first: {failures[0][:300]}")
    return elapsed


@dataclass
class ApiRun:
    seconds: float
    events: int
    collector: dict  # the web workers' while the batches were timed (collector_read)


def through_api(batch_events, *, workers: int, concurrency: int, frozen: bool) -> ApiRun:
    """The batches after the warm-up, and the web workers' collector
    meanwhile (bench.collector_timed_asgi); `frozen`: the web app as
    deployed, else with its startup heap back in the collector's care."""
    port = free_port()
    logs = Path(tempfile.mkdtemp(prefix="bench-gc-"))
    web = ManagedProcess(
        name="web",
        argv=uvicorn_argv(
            "bench.collector_timed_asgi:application", host="127.0.0.1", port=port, workers=workers
        ),
        env={"BENCH_GC_LOG": f"{logs}/", "BENCH_UNFREEZE": "" if frozen else "1"},
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    _key, secret = service_key_create(name="bench ingest")
    bodies = [
        orjson.dumps({"events": chunk}, default=str) for chunk in in_batches(batch_events, 1000)
    ]
    url = f"http://127.0.0.1:{port}/api/v1/usage/events"
    web.start()
    try:
        web.wait_ready(timeout=60)
        # Steady state: each worker has served a batch (imports, URLconf,
        # the directory of names, a database connection) before the clock.
        warm, bodies = bodies[: workers * 2], bodies[workers * 2 :]
        asyncio.run(post_all(url, secret, warm, concurrency))
        before = collector_lines(logs)
        seconds = asyncio.run(post_all(url, secret, bodies, concurrency))
        collector = collector_read(logs, after=before)
    finally:
        web.stop()
        shutil.rmtree(logs, ignore_errors=True)
    return ApiRun(seconds=seconds, events=len(bodies) * 1000, collector=collector)


def _attribute(queue) -> None:
    """In a fresh (spawned) process, so its peak memory is attribution's own."""
    django.setup()
    from metering.jobs import metering_run as run_metering

    with PeakRss() as rss:
        bar = tqdm(desc="attribution", leave=False)
        started = time.perf_counter()
        run = run_metering(
            now=EPOCH + timedelta(days=2), progress=lambda done, total: bar.update(done - bar.n)
        )
        seconds = time.perf_counter() - started
        bar.close()
    queue.put((seconds, run.windows, len(run.hours), rss.take()))


def _attribute_in_fresh_process() -> tuple[float, int, int, float]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    connection.close()
    child = ctx.Process(target=_attribute, args=(queue,))
    child.start()
    result = queue.get(timeout=600)
    child.join()
    return result


def cleanup() -> None:
    """Remove everything the benchmark wrote (January 2001 only)."""
    end = EPOCH + timedelta(days=31)
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS metering_usageevent_y2001m01")
        cursor.execute("DELETE FROM metering_usagekey WHERE received_at < %s", [end])
        # The keys deleted stay in the key table's index until a vacuum: every
        # run after the first would claim its keys in an index full of them
        # (measured: the keys' COPY x 1.6-2 slower after a few runs).
        cursor.execute("VACUUM metering_usagekey")
        for derived in ("metering_attributionshare", "metering_requestshares"):
            cursor.execute(
                f"DELETE FROM {derived} WHERE window_id IN "  # noqa: S608 (our own table names)
                "(SELECT id FROM metering_attributionwindow WHERE start < %s)",
                [end],
            )
        cursor.execute("DELETE FROM metering_attributionwindow WHERE start < %s", [end])
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour < %s", [end])
        cursor.execute("DELETE FROM metering_dirtyhour WHERE hour < %s", [end])


def fleet_remove() -> None:
    Replica.objects.filter(name__startswith="bench-ingest-").delete()
    Pool.objects.filter(name="bench-ingest").delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--writers", type=int, default=2, help="parallel writer processes")
    parser.add_argument("--api-events", type=int, default=100_000)
    parser.add_argument("--api-workers", type=int, default=2)
    parser.add_argument("--api-concurrency", type=int, default=4)
    parser.add_argument("--attribute-events", type=int, default=1_000_000)
    args = parser.parse_args()
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    bench_database("bench_ingest")  # a database of its own, migrated
    cleanup()
    tenants, replicas = bench_fleet()
    rows = []

    say(f"generating {args.events:,} events …")
    service_events = events(
        "svc", args.events, tenants=tenants, replicas=replicas, span=timedelta(hours=1)
    )
    seconds = through_service(service_events, batch=args.batch)
    rows.append(("service: usage_record_batch, 1 writer", args.events, seconds, peak_rss_mib()))
    say(f"  service, 1 writer: {args.events / seconds:,.0f} events/s")
    cleanup()
    seconds = through_service_parallel(service_events, batch=args.batch, writers=args.writers)
    rows.append(
        (
            f"service: usage_record_batch, {args.writers} writer processes",
            args.events,
            seconds,
            None,
        )
    )
    say(f"  service, {args.writers} writers: {args.events / seconds:,.0f} events/s")

    replay = through_service(service_events[: args.batch * 4], batch=args.batch)
    rows.append(
        ("service: the same batches again (all duplicates)", args.batch * 4, replay, peak_rss_mib())
    )

    pre = events(
        "pre", args.events, tenants=tenants, replicas=replicas, span=timedelta(hours=1), seed=8
    )
    validate = validation_only(pre, batch=args.batch)
    rows.append(("validation alone (no writes)", args.events, validate, peak_rss_mib()))
    floor = raw_copy(pre, batch=args.batch)
    rows.append(("floor: raw COPY of the same rows, nothing else", args.events, floor, None))
    cleanup()
    durable = durable_copy(pre, batch=args.batch)
    rows.append((DURABLE_FLOOR, args.events, durable, None))
    cleanup()
    del pre

    say(f"API: {args.api_events:,} events in 1,000-event batches, twice …")
    api_runs = {}
    for seed, frozen in ((9, True), (11, False)):
        api_events = events(
            f"api{seed}", args.api_events, tenants=tenants, replicas=replicas,
            span=timedelta(hours=1), seed=seed,
        )  # fmt: skip
        api_runs[frozen] = run = through_api(
            api_events, workers=args.api_workers, concurrency=args.api_concurrency, frozen=frozen
        )
        rows.append(
            (
                f"REST API ({args.api_workers} uvicorn workers, {args.api_concurrency} "
                "clients, 1,000 per POST, after a warm-up batch per worker)"
                + ("" if frozen else ", the workers' startup heap not frozen (as before)"),
                run.events,
                run.seconds,
                None,
            )
        )
        arm = "" if frozen else " (heap not frozen)"
        say(f"  API{arm}: {run.events / run.seconds:,.0f} events/s")
    del api_events, service_events

    cleanup()
    say(
        f"attribution: loading {args.attribute_events:,} events over a day on {REPLICAS} replicas …"
    )
    day = events(
        "attr",
        args.attribute_events,
        tenants=tenants,
        replicas=replicas,
        span=timedelta(hours=24),
        seed=10,
    )
    load_seconds = through_service_parallel(day, batch=20_000, writers=args.writers)
    del day
    # Steady state, as when a day's usage trickled in: statistics up to date
    # and no autovacuum pass still chewing on the load just made.
    with connection.cursor() as cursor:
        cursor.execute("VACUUM (ANALYZE) metering_usageevent")
    seconds, windows, hours, attribution_rss = _attribute_in_fresh_process()
    rows.append(
        (
            f"ingest of the attribution day ({args.attribute_events:,} events, "
            f"{args.writers} writers)",
            args.attribute_events,
            load_seconds,
            None,
        )
    )
    rows.append(
        (
            f"attribution ({windows} windows) + rollups ({hours} hours)",
            args.attribute_events,
            seconds,
            attribution_rss,
        )
    )
    say(f"  attribution: {seconds:.1f} s for {args.attribute_events:,} events")
    cleanup()
    fleet_remove()

    by_label = {label: count / secs for label, count, secs, _ in rows}
    one = by_label["service: usage_record_batch, 1 writer"]
    two = by_label[f"service: usage_record_batch, {args.writers} writer processes"]
    raw = by_label["floor: raw COPY of the same rows, nothing else"]
    durable = by_label[DURABLE_FLOOR]
    api = next(v for k, v in by_label.items() if k.startswith("REST API"))
    collector = [
        "",
        f"The web workers' garbage collector while the REST API rows were timed (each of the "
        f"{args.api_workers} workers' own collections, summed): as deployed, each worker's "
        "startup heap (Django, the URLconf and every view) is frozen out of the collector's full "
        "passes (core.heap); the other row undoes that, as the web app ran before.",
        "",
        *collector_table(
            {
                "as deployed" if frozen else "startup heap not frozen": run.collector
                for frozen, run in api_runs.items()
            }
        ),
    ]
    attribution = next(secs for label, _, secs, _ in rows if label.startswith("attribution"))
    targets = [
        "",
        "The targets, each beside its floor in this run:",
        "",
        "| path | figure | floor | ratio | target |",
        "|---|---|---|---|---|",
        f"| service, 1 writer | {one:,.0f} events/s | raw COPY {raw:,.0f} events/s | "
        f"x {one / raw:.2f} | ≥ 100,000 events/s and ≥ x 0.7 "
        f"({'met' if one >= 100_000 and one >= 0.7 * raw else 'not met'}) |",
        f"| service, 1 writer | {one:,.0f} events/s | durable COPY {durable:,.0f} events/s | "
        f"x {one / durable:.2f} | (the floor of writing to the ledger at all) |",
        f"| service, {args.writers} writers | {two:,.0f} events/s | 1 writer {one:,.0f} events/s | "
        f"x {two / one:.2f} | ≥ x 1 ({'met' if two >= one else 'not met'}) |",
        f"| REST API | {api:,.0f} events/s | (none) | | ≥ 40,000 events/s "
        f"({'met' if api >= 40_000 else 'not met'}) |",
        f"| attribution + rollups, {args.attribute_events:,} events | {attribution:.2f} s "
        f"| (none) | | ≤ 5 s ({'met' if attribution <= 5 else 'not met'}) |",
    ]
    table = [
        "| step | events | seconds | events/s | peak RSS MiB |",
        "|---|---|---|---|---|",
    ]
    for label, count, secs, rss in rows:
        rss_text = f"{rss:.0f}" if rss is not None else "(server)"
        table.append(f"| {label} | {count:,} | {secs:.2f} | {count / secs:,.0f} | {rss_text} |")
    body = "\n".join(table + targets + collector) + (
        f"\n\nPostgreSQL: {connection.settings_dict['ENGINE'].rsplit('.', 1)[-1]} "
        f"({'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded'}); events carry "
        f"realistic timings (20-2,000 prompt tokens, 1-400 completion tokens); "
        f"service batches of {args.batch:,}. Peak RSS: the benchmark process's high-water mark "
        "so far (it holds the generated events); for attribution, that of a fresh process "
        "running only the metering job. "
        "Original targets: 50,000 events/s through the service, 20,000 through the API, "
        "1 M events attributed in 10 s."
    )
    report_write(
        name="ingest",
        title="Usage ingestion and attribution (bench/ingest.py)",
        command="./dev bench ingest",
        body=body,
    )


if __name__ == "__main__":
    main()
