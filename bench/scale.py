"""bench/scale: the scaled usage path against today's, on the same rows.

    ./dev bench scale [--events 200000] [--paced-seconds 15] [--paced-rate 3000]

One history of N completed requests (both tenants, four replicas, ties
and all: tests.usage_log.history_records) goes:

1. today's path: into the PostgreSQL ledger in gateway-sized flushes
   (usage_record_batch, 500 records), then attributed and rolled up there
   (metering_run);
2. the scaled path, with 1 and then 2 writers: published to a three-node
   NATS JetStream cluster on loopback (metering.log.publisher, the
   gateway's sink, 500 records a flush), written into the Delta table by
   `manage.py usage_writer` processes, then attributed and rolled up as
   Dask jobs on a scheduler and two worker processes (metering_run on the
   scaled path).

Measured: events/s end to end and per stage, CPU per event at each stage
(this process's for publishing and today's ledger; the writers', the Dask
workers' and this process's for the jobs), bytes per event on disk in
each, and the lag from a request's end to its row in the store at a
paced rate of flushes (the gateway's 0.1 s), p50 and p99. Then a sizing
table for 1,000 and 10,000 GPUs at 13 requests/s a GPU, derived from the
measured per-event costs (not measured at that size).

Everything runs on this machine's cores at once (three NATS servers,
the writers, the Dask workers, PostgreSQL and this process), so the two
paths' ratios are the figures to read, not their absolute rates. In a
database of its own, dropped afterwards."""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import database_switch, databases_drop, report_write  # noqa: E402
from core.dask_local import DaskCluster  # noqa: E402
from core.nats_local import NatsCluster  # noqa: E402
from core.processes import ManagedProcess  # noqa: E402
from metering.choices import EventSource  # noqa: E402
from metering.jobs import metering_run  # noqa: E402
from metering.ledger import usage_record_batch  # noqa: E402
from metering.log.distributed import (  # noqa: E402
    store_rollups_rebuild,
    store_windows_compute,
)
from metering.log.messages import messages  # noqa: E402
from metering.log.publisher import Publisher  # noqa: E402
from metering.log.store import RawStore  # noqa: E402
from metering.log.stream import LogConfig  # noqa: E402
from metering.rollups import hour_floor, usage_rollups_refresh  # noqa: E402
from metering.windows import attribution_batches, attribution_windows_due  # noqa: E402
from serving.services import (  # noqa: E402
    local_gpu_ensure,
    pool_ensure,
    replica_register,
    served_model_ensure,
)
from serving.tiny_model import MODEL_NAME, model_config  # noqa: E402
from tenants.services import tenant_create  # noqa: E402
from tests.usage_log import history_records  # noqa: E402

DATABASE = "gpu_ledger_bench_scale"
FLUSH = 500  # records per gateway flush (GATEWAY_RECORD_FLUSH_MAX)
GPU_REQUESTS_PER_SECOND = 13  # a busy GPU serving a 70B model (DESIGN.md)
DERIVED = (
    "metering_requestshares, metering_attributionshare, metering_attributionwindow, "
    "metering_usagerollup, metering_replicaloadhour, metering_dirtyhour"
)


def cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def me() -> float:
    return time.process_time()


def world_make() -> SimpleNamespace:
    model = served_model_ensure(name=MODEL_NAME, config=model_config())
    pool = pool_ensure(name="bench-scale")
    replicas = {
        f"r{n}": replica_register(
            name=f"bench-scale-r{n}",
            base_url=f"http://127.0.0.1:{19100 + n}",
            model=model,
            pool=pool,
            gpus=[local_gpu_ensure(serial=f"bench-scale-gpu-{n}")],
        )
        for n in range(4)
    }
    tenants = {
        "a": tenant_create(name="Scale A", slug="scale-a"),
        "b": tenant_create(name="Scale B", slug="scale-b", billing_currency="EUR"),
    }
    return SimpleNamespace(model=model, replicas=replicas, tenants=tenants)


def derived_clear() -> None:
    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {DERIVED}")


@dataclass
class Stage:
    seconds: float
    cpu: float  # seconds, all processes that did it


def ledger_path(records, later) -> dict:
    connection.ensure_connection()
    backend = psutil.Process(connection.connection.info.backend_pid)  # PostgreSQL is local
    pg_before = cpu_seconds([backend.pid])
    started, cpu = time.perf_counter(), me()
    for i in range(0, len(records), FLUSH):
        usage_record_batch(
            events=[vars(r) for r in records[i : i + FLUSH]], source=EventSource.GATEWAY
        )
    ingest = Stage(time.perf_counter() - started, me() - cpu)
    pg_cpu = cpu_seconds([backend.pid]) - pg_before
    started, cpu = time.perf_counter(), me()
    metering_run(now=later)
    jobs = Stage(time.perf_counter() - started, me() - cpu)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class c "
            "JOIN pg_inherits i ON i.inhrelid = c.oid "
            "WHERE i.inhparent = 'metering_usageevent'::regclass"
        )
        ledger_bytes = int(cursor.fetchone()[0] or 0)
        cursor.execute("SELECT pg_total_relation_size('metering_usagekey')")
        ledger_bytes += cursor.fetchone()[0]
    return {"ingest": ingest, "jobs": jobs, "bytes": ledger_bytes, "pg_cpu": pg_cpu}


def start_writers(n: int, env: dict, logs: Path) -> list[ManagedProcess]:
    writers = []
    for k in range(n):
        writer = ManagedProcess(
            name=f"usage-writer-{k}",
            argv=[sys.executable, "manage.py", "usage_writer", "--id", f"bench-{k}"],
            env=env,
            log_path=logs / f"writer-{n}-{k}.log",
        )
        writer.start()
        writers.append(writer)
    return writers


def until(check, *, what: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(
                f"bench scale: {what} not after {timeout:.0f} s (see the writers' logs)"
            )
        time.sleep(0.2)


def scaled_parts(cluster: NatsCluster, stream: str, store_dir: Path, db_url: str, root, writers):
    """A run's own stream and store: its config, `writers` writer
    processes on them, a publisher and the store to read."""
    cfg = {**settings.USAGE_LOG, "URL": cluster.url, "STREAM": stream, "STORE_URL": str(store_dir)}
    env = {
        "DATABASE_URL": db_url,
        "USAGE_LOG_URL": cluster.url,
        "USAGE_LOG_STREAM": stream,
        "USAGE_STORE_URL": str(store_dir),
    }
    config = LogConfig.from_settings(cfg)
    procs = start_writers(writers, env, root)
    return config, procs, Publisher(config), RawStore(str(store_dir), stream=stream)


def first_publish(publisher: Publisher, records) -> None:
    """Publish `records` once the writers have made the stream (they do on start)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            publisher.publish(records)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def stream_delete(config: LogConfig) -> None:
    """Each run its own stream: two streams may not share subjects."""
    import asyncio

    import nats

    async def delete():
        nc = await nats.connect(servers=config.servers)
        try:
            await nc.jetstream(timeout=10).delete_stream(config.stream)
        finally:
            await nc.close()

    asyncio.run(delete())


def rows_in(store: RawStore) -> int:
    try:
        return store.read(columns=["log_seq"]).num_rows
    except Exception:  # the table not made yet
        return 0


def scaled_path(records, cluster: NatsCluster, writers: int, root: Path, db_url: str) -> dict:
    stream = f"BENCH{writers}"
    store_dir = root / f"store-{writers}"
    parts = scaled_parts(cluster, stream, store_dir, db_url, root, writers)
    config, procs, publisher, store = parts
    try:
        first_publish(publisher, records[:1])
        time.sleep(8)  # the writers share the partitions out (their leases settle)
        before = cpu_seconds([p.pid for p in procs])
        started, cpu = time.perf_counter(), me()
        for i in range(1, len(records), FLUSH):
            publisher.publish(records[i : i + FLUSH])
        publish = Stage(time.perf_counter() - started, me() - cpu)
        until(lambda: rows_in(store) >= len(records), what="every record in the store")
        through = time.perf_counter() - started
        write = Stage(through, cpu_seconds([p.pid for p in procs]) - before)
        message_bytes = sum(
            len(m.payload) for m in messages(records[:20_000], partitions=config.partitions)
        ) / min(20_000, len(records))
    finally:
        publisher.close()
        for proc in procs:
            proc.stop()
        stream_delete(config)
    data_bytes = sum(p.stat().st_size for p in store_dir.rglob("*.parquet"))
    return {
        "publish": publish,
        "write": write,
        "through": through,
        "config": config,
        "store_bytes": data_bytes,
        "message_bytes": message_bytes,
    }


def scaled_jobs(config: LogConfig, dask: DaskCluster, later) -> dict:
    from distributed import Client

    workers = [w.pid for w in dask.worker_processes]
    with Client(dask.address) as client:
        due = attribution_windows_due(now=later)
        before, started, cpu = cpu_seconds(workers), time.perf_counter(), me()
        for batch in attribution_batches(due):
            store_windows_compute(window_ids=batch, client=client, config=config)
        attribute = Stage(time.perf_counter() - started, me() - cpu + cpu_seconds(workers) - before)
        before, started, cpu = cpu_seconds(workers), time.perf_counter(), me()
        usage_rollups_refresh(rebuild=store_rollups_rebuild(client=client, config=config))
        rollup = Stage(time.perf_counter() - started, me() - cpu + cpu_seconds(workers) - before)
    return {"attribute": attribute, "rollup": rollup}


def paced_lag(world, cluster: NatsCluster, root: Path, db_url: str, *, seconds, rate) -> dict:
    """Flushes every 0.1 s at `rate` records/s, each record ending as it
    is flushed: how long until it is a row in the store (its commit)."""
    stream = "BENCHLAG"
    store_dir = root / "store-lag"
    config, procs, publisher, store = scaled_parts(cluster, stream, store_dir, db_url, root, 1)
    sent = {}
    try:
        template = history_records(
            world, 1, seed=7, start=hour_floor(datetime.now(UTC)) - timedelta(hours=3)
        )[0]
        first_publish(publisher, [template])
        time.sleep(5)
        per_flush = max(1, int(rate / 10))
        began, n = time.perf_counter(), 0
        for flush in range(int(seconds * 10)):
            wait = began + flush / 10 - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            now = datetime.now(UTC)
            batch = []
            for _ in range(per_flush):
                n += 1
                replica = list(world.replicas.values())[n % 4]
                start = now - timedelta(milliseconds=50)
                record = replace(
                    template,
                    request_id=f"lag-{n}",
                    status="ok",
                    replica_id=replica.id,
                    pool_id=replica.pool_id,
                    received_at=start,
                    sent_at=start,
                    first_token_at=start,
                    ended_at=now,
                    queue_ms=None,
                    ttft_ms=None,
                    generation_ms=None,
                    timing="gateway",
                )
                batch.append(record)
                sent[record.request_id] = time.time()
            publisher.publish(batch)
        until(lambda: rows_in(store) >= n + 1, what="the paced records in the store")
    finally:
        publisher.close()
        for proc in procs:
            proc.stop()
    rows = store.read(columns=["request_id", "ended_at", "ingested_at"]).to_pylist()
    lags = sorted(
        (r["ingested_at"] - r["ended_at"]).total_seconds()
        for r in rows
        if r["request_id"].startswith("lag-")
    )
    return {
        "p50": lags[len(lags) // 2],
        "p99": lags[int(len(lags) * 0.99)],
        "rate": per_flush * 10,
        "commit_seconds": config.commit_seconds,
    }


def maintained(config: LogConfig, *, now) -> dict:
    """The store's upkeep over the 2-writer run's table, every hour closed:
    its seconds and CPU, its files and bytes after."""
    from django.test import override_settings

    from metering.log.maintenance import store_maintain

    started, cpu = time.perf_counter(), me()
    with override_settings(USAGE_LOG={**settings.USAGE_LOG, "STORE_VACUUM_HOURS": 0}):
        done = store_maintain(config=config, now=now)
    stage = Stage(time.perf_counter() - started, me() - cpu)
    data = list(Path(config.store_url).glob("hour=*/*.parquet"))
    return {
        "stage": stage,
        "files_before": done.files_before,
        "files_after": len(data),
        "bytes": sum(p.stat().st_size for p in data),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--paced-seconds", type=float, default=15)
    parser.add_argument("--paced-rate", type=int, default=3000)
    args = parser.parse_args()
    n = args.events
    home = connection.settings_dict["NAME"]
    db_url = database_switch(DATABASE, create=True)
    root = Path(tempfile.mkdtemp(prefix="bench-scale-", dir=Path.home()))
    nats = dask = None
    try:
        call_command("migrate", verbosity=0)
        world = world_make()
        now = datetime.now(UTC)
        later = now + timedelta(hours=2)
        print(f"{n:,} records …", flush=True)
        records = history_records(world, n, seed=61, start=hour_floor(now) - timedelta(hours=3))
        served = sum(1 for r in records if r.status != "rejected")

        print("today's path: the PostgreSQL ledger …", flush=True)
        ledger = ledger_path(records, later)
        derived_clear()

        print("a three-node NATS JetStream cluster and a Dask cluster …", flush=True)
        nats = NatsCluster(root / "nats").start()
        dask = DaskCluster(
            root / "dask", workers=2, env={"DJANGO_SETTINGS_MODULE": "config.settings.local"}
        ).start()
        scaled = {}
        for writers in (1, 2):
            print(f"the scaled path, {writers} writer(s) …", flush=True)
            derived_clear()
            scaled[writers] = scaled_path(records, nats, writers, root, db_url)
        print("the hour jobs on Dask …", flush=True)
        jobs = scaled_jobs(scaled[2]["config"], dask, later)
        print("the store's upkeep (compaction, vacuum) …", flush=True)
        upkeep = maintained(scaled[2]["config"], now=later + timedelta(hours=3))
        print("lag at a paced rate …", flush=True)
        lag = paced_lag(world, nats, root, db_url, seconds=args.paced_seconds, rate=args.paced_rate)
    finally:
        if dask is not None:
            dask.stop()
        if nats is not None:
            nats.stop()
        shutil.rmtree(root, ignore_errors=True)
        database_switch(home)
        databases_drop(DATABASE)

    def rate(stage: Stage) -> str:
        return f"{n / stage.seconds:,.0f}"

    def us(cpu: float) -> str:
        return f"{cpu / n * 1e6:,.1f}"

    one, two = scaled[1], scaled[2]
    store_per_event = upkeep["bytes"] / n  # closed hours, compacted: the store at rest
    pg_per_event = ledger["bytes"] / n
    lines = [
        f"One history of {n:,} requests ({served:,} served, the rest rejected), four replicas, "
        "two tenants (USD, EUR), through both paths. Every process shares this machine's two "
        "cores: read the ratios.",
        "",
        "| stage | today's path (PostgreSQL) | scaled, 1 writer | scaled, 2 writers |",
        "|---|---|---|---|",
        f"| record: events/s (end to end, to durable) | {rate(ledger['ingest'])} | "
        f"{n / one['through']:,.0f} | {n / two['through']:,.0f} |",
        f"| publish: events/s, CPU µs/event (the gateway's sink) | — | "
        f"{rate(one['publish'])}, {us(one['publish'].cpu)} | "
        f"{rate(two['publish'])}, {us(two['publish'].cpu)} |",
        f"| write: CPU µs/event (ledger COPY here; the writers there) | "
        f"{us(ledger['ingest'].cpu)} + PostgreSQL's {us(ledger['pg_cpu'])} | "
        f"{us(one['write'].cpu)} | {us(two['write'].cpu)} |",
        f"| attribute + roll up: seconds, CPU µs/event | {ledger['jobs'].seconds:.1f} s, "
        f"{us(ledger['jobs'].cpu)} (this process; PostgreSQL's not counted) | — | "
        f"{jobs['attribute'].seconds + jobs['rollup'].seconds:.1f} s, "
        f"{us(jobs['attribute'].cpu)} + {us(jobs['rollup'].cpu)} |",
        f"| bytes/event on disk, as written | {pg_per_event:,.0f} (ledger + keys) | "
        f"{one['store_bytes'] / n:,.1f} (Parquet) | {two['store_bytes'] / n:,.1f} (Parquet) |",
        f"| upkeep: closed hours compacted, then vacuumed | — | — | "
        f"{upkeep['files_before']:,} files → {upkeep['files_after']:,}, "
        f"{upkeep['stage'].seconds:.1f} s, {us(upkeep['stage'].cpu)} CPU µs/event, "
        f"{store_per_event:,.1f} bytes/event |",
        "",
        f"Lag from a request's end to its row in the store, flushes every 0.1 s at "
        f"{lag['rate']:,} events/s, one writer committing every {lag['commit_seconds']:g} s: "
        f"p50 {lag['p50']:.2f} s, p99 {lag['p99']:.2f} s.",
        "",
        f"Writers 1 → 2: x{one['through'] / two['through']:.2f} events/s "
        f"(on two cores shared with three NATS servers and the publisher).",
        "",
        "Sizing, derived from the per-event costs above (not measured at this size):",
        "",
        "| fleet | events/s | writer cores | Dask cores (attribute + roll up) | "
        "store per day | NATS per day (3 replicas) | writers at the measured rate |",
        "|---|---|---|---|---|---|---|",
    ]
    writer_us = two["write"].cpu / n * 1e6
    jobs_us = (jobs["attribute"].cpu + jobs["rollup"].cpu) / n * 1e6
    per_writer = n / one["through"]
    for gpus in (1_000, 10_000):
        events = gpus * GPU_REQUESTS_PER_SECOND
        day = events * 86_400
        lines.append(
            f"| {gpus:,} GPUs | {events:,} | {events * writer_us / 1e6:,.1f} | "
            f"{events * jobs_us / 1e6:,.1f} | {day * store_per_event / 1e9:,.0f} GB | "
            f"{day * two['message_bytes'] * 3 / 1e9:,.0f} GB | "
            f"{math.ceil(events / per_writer):,} |"
        )
    lines += [
        "",
        f"PostgreSQL would take {day_gb(pg_per_event, 13_000):,.0f} GB a day at 1,000 GPUs "
        f"and {day_gb(pg_per_event, 130_000):,.0f} GB at 10,000.",
        "",
        "The store's bytes per event are its closed hours', compacted (as the hourly upkeep "
        "leaves them); as the writers commit them, a few seconds' worth a file, see the table.",
        "",
        f"scale: {store_per_event:.1f} bytes/event (store) vs {pg_per_event:.0f} (PostgreSQL)",
    ]
    report_write(
        name="scale",
        title="The scaled usage path against today's (bench/scale.py)",
        command=f"./dev bench scale --events {n}",
        body="\n".join(lines),
    )


def day_gb(per_event: float, events_per_second: int) -> float:
    return per_event * events_per_second * 86_400 / 1e9


if __name__ == "__main__":
    main()
