"""bench/fleet: a simulated GPU fleet at an operator's scale, metered
through the whole pipeline, for each fleet size (`--sizes`, workers).

The fleet is NVIDIA Dynamo 1.6.1: three deployments (a frontend, its
event broker and a mocker process serving its workers; serving.dynamo),
one per pool kind, each frontend a replica of its pool and each worker a
replica of its own holding four GPUs (a tensor-parallel H100 replica):
- shared: half the workers, aggregated, vLLM-style scheduling;
- reserved (held by the largest tenant): a quarter, disaggregated, one
  prefill worker to three decode workers;
- dedicated (owned by the second tenant): a quarter, SGLang-style.
Every figure is simulated: the mockers' timing is GPU-like at
`--speedup-ratio` (1: real time), their KV caches and batches simulated.

Thousands of tenants (`--tenants`, a tenth billed in EUR) call one gateway
(`--gateway-workers`, fair queuing on, limits in Redis when REDIS_URL is
set) with their own keys (bench/fleet_traffic.py, in a process of its
own): first a compressed day (diurnal, Zipf-popular tenants, bursts),
then rising flat steps. Then, in a fresh process whose memory is sampled,
the pipeline the platform runs on its schedule: attribution and rollups,
today's cost allocation, this period's draft invoices, the month's margin
report (demo.stack.pipeline_run).

Measured per size:
- the highest step the pipeline kept up with: at least 98% of the offered
  requests served, none failed, their end-to-end p50 within KEPT_E2E times
  the day's (no queue building up), and ledger lag p99 within LAG_KEPT_S;
- ledger lag, request end (the gateway's) to its row's ingestion
  (ingested_at, the writer's batch; its commit follows within a few ms),
  over the day;
- every served request in the ledger (rows of the day and the steps
  against what the tenants were answered);
- attribution's seconds, and per hour of traffic at the rate kept up with;
- allocation, invoicing and margins' seconds;
- the peak resident memory of each process.

Each size runs in a database of its own, copied from a template migrated
and seeded once (`<the database>_fleet`, dropped at the end).

    ./dev bench fleet [--sizes 8,16,32,64] [--tenants 2000] [--day-seconds 60]
        [--day-peak 40] [--steps 30,45,60,75,90,105,120] [--step-seconds 10]

Prints the tables and writes them to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import pickle
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()
logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per health check

import psutil  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import PeakRss, database_switch, databases_drop, report_write  # noqa: E402
from bench.fleet_traffic import Plan, traffic_process  # noqa: E402
from bench.gateway import gateway_process  # noqa: E402
from demo.seeds.billing import cost_rates_demo_seed, fx_rates_demo_seed, prices_demo_seed  # noqa: E402
from demo.stack import gateway_fleet_seen, records_flushed  # noqa: E402
from serving.choices import Engine, PoolKind  # noqa: E402
from serving.dynamo import WorkerGroup, dynamo_install, dynamo_installed, dynamo_start  # noqa: E402
from serving.engine_workers import engine_workers_refresh  # noqa: E402
from serving.gpu_shares import Share  # noqa: E402
from serving.local_replicas import tiny_model_served  # noqa: E402
from serving.models import Gpu, GpuSku, Node, Pool, Reservation  # noqa: E402
from serving.services import replica_gpu_shares_set, replica_register  # noqa: E402
from serving.tiny_model import MODEL_NAME, tiny_model_write  # noqa: E402
from tenants.services import api_key_create, tenant_create  # noqa: E402

GPUS_PER_WORKER = 4
KEPT_SERVED = 0.98  # ok-float: the share of offered requests a kept-up step serves
LAG_KEPT_S = 5.0  # ok-float: a kept-up step's ledger lag p99 bound
KEPT_E2E = 2.0  # ok-float: a kept-up step's e2e p50 bound, against the day's
SAMPLE_S = 0.25  # ok-float: the memory sampler's period
RESULTS = settings.VAR_DIR / "bench-fleet.pickle"  # the last run's, for --report-only


def say(message: str) -> None:
    print(message, flush=True)


# --- A database per size, copied from a seeded template ----------------------


def database_use(name: str, **made) -> None:
    """This process, and the processes it starts from now on, on database
    `name` (made afresh with `made`: bench.common.database_switch)."""
    os.environ["DATABASE_URL"] = database_switch(name, **made)


def database_copy(base: str, template: str, work: str) -> None:
    """A fresh `work` copied from `template`, and this process on it."""
    database_use(base)
    database_use(work, create=True, template=template)


# --- The world: tenants, prices, rates ---------------------------------------


def world_seed(tenants: int) -> list[str]:
    """Tenants with default policies, one key each (their secrets, by
    popularity rank), the demo's prices and cost rates, FX rates for EUR."""
    secrets = []
    for n in range(tenants):
        tenant = tenant_create(
            name=f"Fleet tenant {n}",
            slug=f"fleet-{n}",
            billing_currency="EUR" if n % 10 == 3 else "USD",
        )
        secrets.append(api_key_create(tenant=tenant, name="fleet", scopes=["inference"])[1])
    tiny_model_served()
    prices_demo_seed()
    cost_rates_demo_seed()
    fx_rates_demo_seed(start=date.today() - timedelta(days=40))
    return secrets


# --- The fleet ---------------------------------------------------------------


@dataclass
class Deployment:
    kind: str
    groups: list[WorkerGroup]
    running: object = None  # serving.dynamo.DynamoDeployment
    workers: list = field(default_factory=list)


def fleet_plan(size: int, speedup: float) -> list[Deployment]:  # ok-float
    """Half the workers shared, a quarter reserved (disaggregated, 1:3), a
    quarter dedicated."""
    shared, rest = size // 2, size - size // 2
    reserved = rest // 2
    prefill = max(1, reserved // 4)
    mock = {"speedup_ratio": speedup}
    return [
        Deployment(PoolKind.SHARED, [WorkerGroup(count=shared, **mock)]),
        Deployment(
            PoolKind.RESERVED,
            [
                WorkerGroup(mode="prefill", count=prefill, **mock),
                WorkerGroup(mode="decode", count=reserved - prefill, **mock),
            ],
        ),
        Deployment(
            PoolKind.DEDICATED, [WorkerGroup(engine_type="sglang", count=rest - reserved, **mock)]
        ),
    ]


def fleet_start(size: int, speedup: float) -> list[Deployment]:  # ok-float
    """Start and register the fleet: pools (the reserved one held by the
    first tenant, the dedicated one owned by the second), each frontend a
    replica, each worker one with GPUS_PER_WORKER GPUs of its own."""
    from tenants.models import Tenant

    owners = {t.slug: t for t in Tenant.objects.filter(slug__in=["fleet-0", "fleet-1"])}
    model_dir = tiny_model_write(directory=settings.VAR_DIR / "models" / MODEL_NAME)
    model = tiny_model_served()
    sku = GpuSku.objects.create(name="H100 SXM (fleet)", power_idle_watts=90, power_busy_watts=700)
    deployments = fleet_plan(size, speedup)
    started = []
    try:
        for d in deployments:
            d.running = dynamo_start(
                name=f"fleet-{d.kind}",
                model_dir=model_dir,
                served_model=MODEL_NAME,
                workers=d.groups,
            )
            started.append(d)
        for d in deployments:
            d.running.wait_ready(timeout=180)
            owner = {PoolKind.RESERVED: owners["fleet-0"], PoolKind.DEDICATED: owners["fleet-1"]}
            pool = Pool.objects.create(name=f"fleet-{d.kind}", kind=d.kind, owner=owner.get(d.kind))
            workers = sum(g.count for g in d.groups)
            frontend = replica_register(
                name=f"fleet-{d.kind}",
                base_url=d.running.base_url,
                model=model,
                pool=pool,
                gpus=[],
                engine=Engine.DYNAMO,
                max_inflight=64 * workers,
            )
            d.workers = engine_workers_refresh(frontend) or []
            if len(d.workers) != workers:
                raise RuntimeError(f"{d.kind}: {len(d.workers)} workers registered, not {workers}")
            for n, worker in enumerate(d.workers):
                node = Node.objects.create(name=f"fleet-{d.kind}-node{n}", site="fleet")
                gpus = Gpu.objects.bulk_create(
                    Gpu(
                        serial=f"fleet-{d.kind}-{n}-{g}",
                        sku=sku,
                        node=node,
                        in_service_date=date(2025, 7, 1),
                        capex=Decimal("28000"),
                        useful_life_months=48,
                        salvage_value=Decimal("2800"),
                    )
                    for g in range(GPUS_PER_WORKER)
                )
                replica_gpu_shares_set(replica=worker, shares=[Share(gpu_id=g.pk) for g in gpus])
            if d.kind == PoolKind.RESERVED:
                now = datetime.now(UTC)
                Reservation.objects.create(
                    tenant=owners["fleet-0"],
                    pool=pool,
                    gpu_count=workers * GPUS_PER_WORKER,
                    start=now - timedelta(days=30),
                    end=now + timedelta(days=335),
                )
    except BaseException:
        fleet_stop(started)
        raise
    return deployments


def fleet_stop(deployments: list[Deployment]) -> None:
    for d in deployments:
        if d.running is not None:
            d.running.stop()


# --- Memory, sampled from outside --------------------------------------------


class Peaks:
    """The peak resident memory of named processes (each with its children
    counted apart: the largest of them), sampled every SAMPLE_S, and the CPU
    seconds each name's processes spent (children included) while sampled;
    `other`: the rest of the machine's (PostgreSQL, Redis, the system)."""

    def __init__(self, named: dict[str, list[int]]) -> None:
        self.named = {label: [psutil.Process(p) for p in pids] for label, pids in named.items()}
        self.peak: dict[str, float] = dict.fromkeys(named, 0.0)  # ok-float: MiB
        self._cpu_first: dict[int, float] = {}  # ok-float: CPU seconds
        self._cpu_last: dict[int, tuple[str, float]] = {}  # ok-float
        self.cpu: dict[str, float] = {}  # ok-float: CPU seconds
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def add(self, label: str, pid: int) -> None:
        self.named[label] = [psutil.Process(pid)]
        self.peak.setdefault(label, 0.0)

    def _sample(self) -> None:
        while True:
            for label, processes in list(self.named.items()):
                for process in processes:
                    with contextlib.suppress(psutil.Error):
                        for p in (process, *process.children(recursive=True)):
                            rss = p.memory_info().rss / 2**20
                            self.peak[label] = max(self.peak[label], rss)
                            times = p.cpu_times()
                            spent = times.user + times.system
                            self._cpu_first.setdefault(p.pid, spent)
                            self._cpu_last[p.pid] = (label, spent)
            if self._done.wait(SAMPLE_S):
                return

    def __enter__(self) -> Peaks:
        self._machine = psutil.cpu_times()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        machine = psutil.cpu_times()
        busy = sum(
            getattr(machine, f) - getattr(self._machine, f)
            for f in ("user", "nice", "system", "irq", "softirq")
        )
        for pid, (label, spent) in self._cpu_last.items():
            self.cpu[label] = self.cpu.get(label, 0.0) + spent - self._cpu_first[pid]
        self.cpu["other"] = max(0.0, busy - sum(self.cpu.values()))


# --- Ledger lag and completeness ---------------------------------------------


def ledger_served() -> int:
    """The requests the ledger holds as served (this size's database holds
    nothing else)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM metering_usageevent WHERE phase <> 'prefill' AND status = 'ok'"
        )
        return cursor.fetchone()[0]


def ledger_read(start: float, end: float) -> dict:  # ok-float: epoch seconds
    """Over requests received in [start, end): the ledger's requests (a
    disaggregated request's decode row stands for it) and the lag from
    request end to ingestion (s): p50, p99, max."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT count(*) FILTER (WHERE phase <> 'prefill'),
                   percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
                   percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
                   max(lag)
            FROM (SELECT phase, extract(epoch FROM ingested_at - ended_at) AS lag
                  FROM metering_usageevent
                  WHERE received_at >= to_timestamp(%s) AND received_at < to_timestamp(%s)) rows
            """,
            [start, end],
        )
        rows, p50, p99, most = cursor.fetchone()
    return {"rows": rows, "lag": (p50 or 0.0, p99 or 0.0, most or 0.0)}


@dataclass
class Part:
    """One part of the load as the tenants saw it and as the ledger has it."""

    name: str
    offered: float  # ok-float: requests a second
    seconds: float  # ok-float
    sent: int
    served: int  # HTTP 200
    refused: int  # 429 (a tenant's own limit) or 503 (the platform's)
    failed: int  # another status, or no answer
    e2e_ms: list[float]  # ok-float: served requests' end-to-end
    ledger: dict

    @property
    def served_rate(self) -> float:  # ok-float
        return self.served / self.seconds

    def kept_up(self, day: Part) -> bool:
        return (
            self.served >= KEPT_SERVED * self.sent
            and pct(self.e2e_ms, 50) <= KEPT_E2E * pct(day.e2e_ms, 50)
            and self.failed == 0
            and self.ledger["lag"][1] <= LAG_KEPT_S
        )


def parts_read(results, *, begin: float, args) -> list[Part]:  # ok-float
    """The day and each step, from the tenants' results and the ledger."""
    spans = [("day", args.day_peak, begin, begin + args.day_seconds)]
    start = begin + args.day_seconds
    for n, rate in enumerate(args.steps):
        spans.append((f"step{n}", rate, start, start + args.step_seconds))
        start += args.step_seconds
    parts = []
    for name, offered, t0, t1 in spans:
        mine = [r for r in results if r[0] == name]
        served = [r for r in mine if r[3] == 200]
        parts.append(
            Part(
                name=name,
                offered=offered,
                seconds=t1 - t0,
                sent=len(mine),
                served=len(served),
                refused=sum(r[3] in (429, 503) for r in mine),
                failed=sum(r[3] not in (200, 429, 503) for r in mine),
                e2e_ms=[(r[2] - r[1]) * 1000 for r in served],
                ledger=ledger_read(
                    min((r[1] for r in mine), default=t0) - 0.5,
                    max((r[1] for r in mine), default=t1) + 0.5,
                ),
            )
        )
    return parts


# --- The pipeline, in a fresh process ----------------------------------------


def _pipeline(queue) -> None:
    django.setup()
    from demo.stack import pipeline_run

    with PeakRss() as rss:
        result = pipeline_run()
        queue.put(
            {
                "seconds": result["seconds"],
                "windows": result["windows"],
                "drafts": result["drafts"],
                "rss": rss.take(),
            }
        )


def pipeline_measured() -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_pipeline, args=(queue,))
    process.start()
    result = queue.get(timeout=3600)
    process.join()
    return result


# --- One size ------------------------------------------------------------------


def size_run(size: int, *, secrets: list[str], args, key_cache: str | None = None) -> dict:
    """One fleet size's run; `key_cache`: the gateway's GATEWAY_KEY_CACHE_SECONDS
    (None: its default)."""
    label = f"{size}" + (f", key cache {key_cache} s" if key_cache else "")
    say(f"\n== {label} workers ({size * GPUS_PER_WORKER} simulated GPUs)")
    started = time.monotonic()
    deployments = fleet_start(size, args.speedup_ratio)
    say(f"  fleet up in {time.monotonic() - started:.1f} s")
    gateway = None
    try:
        gateway, port = gateway_process(
            f"fleet-{size}",
            {
                "GATEWAY_FLEET_REFRESH_SECONDS": "2",
                **({"GATEWAY_KEY_CACHE_SECONDS": key_cache} if key_cache else {}),
            },
            args=["--workers", str(args.gateway_workers)],
        )
        gateway.start()
        gateway.wait_ready(timeout=90)
        operator = gateway.ready_url.rsplit("/", 1)[0]
        gateway_fleet_seen(operator)
        named = {"gateway": [gateway.pid]}
        for d in deployments:
            for process in d.running.processes:
                role = process.name.rsplit("-", 1)[-1].rstrip("0123456789")
                role = "mocker" if role in ("agg", "prefill", "decode") else role
                named.setdefault(f"dynamo {role}", []).append(process.pid)
        plan = Plan(
            gateway=f"http://127.0.0.1:{port}",
            model=MODEL_NAME,
            secrets=secrets,
            day_seconds=args.day_seconds,
            day_peak=args.day_peak,
            steps=tuple(args.steps),
            step_seconds=args.step_seconds,
        )
        context = multiprocessing.get_context("spawn")
        receive, send = context.Pipe(duplex=False)
        load = context.Process(target=traffic_process, args=(send, plan))
        with Peaks(named) as peaks:
            begin = time.time()
            load.start()
            peaks.add("tenants' load", load.pid)
            results = receive.recv()
            load.join()
            records_flushed(operator, timeout=120)
        parts = parts_read(results, begin=begin, args=args)
        in_ledger = ledger_served()
        say(f"  traffic sent: {len(results)} requests; pipeline ...")
        pipeline = pipeline_measured()
        say(f"  pipeline: {pipeline['seconds']}")
    finally:
        if gateway is not None:
            gateway.stop()
        fleet_stop(deployments)
    return {
        "size": size,
        "label": label,
        "parts": parts,
        "peaks": peaks.peak,
        "cpu": peaks.cpu,
        "pipeline": pipeline,
        "in_ledger": in_ledger,
    }


# --- The report ----------------------------------------------------------------


def pct(values: list[float], q: float) -> float:  # ok-float
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


def kept_rate(run: dict) -> Part | None:
    steps = [p for p in run["parts"] if p.name.startswith("step")]
    kept = None
    for step in steps:
        if not step.kept_up(run["parts"][0]):
            break
        kept = step
    return kept


def report(runs: list[dict], args) -> str:
    pace = "real time" if args.speedup_ratio == 1 else "faster than real time"
    lines = [
        f"**Simulated**: each worker is an NVIDIA Dynamo 1.6.1 mocker worker standing for a "
        f"replica of {GPUS_PER_WORKER} GPUs, at --speedup-ratio {args.speedup_ratio:g} ({pace}), "
        f"its default batch and KV cache, with the tiny model's tokenizer. The gateway, the "
        f"ledger, PostgreSQL, Redis and the pipeline are real, on this machine's cores, shared "
        f"with the simulated fleet and the tenants' load. {args.tenants} tenants (a tenth billed "
        f"in EUR), one gateway ({args.gateway_workers} workers, fair queuing on). The day: "
        f"{args.day_seconds:g} s, peak {args.day_peak:g} req/s, a quarter of it at night, bursts "
        f"of 10-40 requests from one tenant about every 4 s. Steps: "
        f"{', '.join(f'{s:g}' for s in args.steps)} req/s, {args.step_seconds:g} s each.",
        "",
        "### What the pipeline keeps up with",
        "",
        "| workers (GPUs) | kept up with, req/s | first step missed | why | served in full up to "
        "| day: served / sent | day e2e p50 / p99 | ledger lag p50 / p99 / max "
        "| in the ledger / served |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        kept = kept_rate(run)
        day = run["parts"][0]
        steps = [p for p in run["parts"] if p.name.startswith("step")]
        missed = next((p for p in steps if not p.kept_up(day)), None)
        served_total = sum(p.served for p in run["parts"])
        ledger_total = run["in_ledger"]
        lag = day.ledger["lag"]
        lines.append(
            f"| {run['label']} ({run['size'] * GPUS_PER_WORKER}) "
            f"| {kept.served_rate:.0f} (offered {kept.offered:g})"
            if kept
            else f"| {run['label']} ({run['size'] * GPUS_PER_WORKER}) | below {steps[0].offered:g}"
        )
        lines[-1] += (
            f" | {f'{missed.offered:g}' if missed else 'none'} | {why(missed, day)} "
            f"| {served_in_full(steps)} | {day.served} / {day.sent} "
            f"| {pct(day.e2e_ms, 50):.0f} / {pct(day.e2e_ms, 99):.0f} ms "
            f"| {lag[0]:.2f} / {lag[1]:.2f} / {lag[2]:.2f} s | {ledger_total} / {served_total} |"
        )
    lines += [
        "",
        "### Each step",
        "",
        "| workers | offered req/s | served req/s | refused | failed | e2e p50 / p99 "
        "| ledger lag p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for p in run["parts"][1:]:
            lines.append(
                f"| {run['label']} | {p.offered:g} | {p.served_rate:.1f} "
                f"| {p.refused} | {p.failed} "
                f"| {pct(p.e2e_ms, 50):.0f} / {pct(p.e2e_ms, 99):.0f} ms "
                f"| {p.ledger['lag'][1]:.2f} s |"
            )
    lines += [
        "",
        "### The pipeline after the traffic (one pass, as the schedule runs it)",
        "",
        "| workers | requests | attribution s (windows) | per hour of traffic at the rate "
        "kept up with | allocation s | invoices s (drafts) | margins s | its peak MiB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        pipe = run["pipeline"]
        s = pipe["seconds"]
        requests = sum(p.ledger["rows"] for p in run["parts"])
        kept = kept_rate(run)
        hourly = (
            f"{s['attribution'] / max(1, requests) * kept.served_rate * 3600:.0f} s"
            if kept
            else "n/a"
        )
        lines.append(
            f"| {run['label']} | {requests} | {s['attribution']:.1f} ({pipe['windows']}) "
            f"| {hourly} | {s['allocation']:.1f} | {s['invoices']:.1f} ({pipe['drafts']}) "
            f"| {s['margins']:.1f} | {pipe['rss']:.0f} |"
        )
    labels = sorted({label for run in runs for label in run["cpu"]})
    per_request = [sum(r["cpu"].values()) / max(1, sum(p.served for p in r["parts"])) for r in runs]
    gateway = [r["cpu"].get("gateway", 0) / max(1, sum(p.served for p in r["parts"])) for r in runs]
    cores = os.cpu_count() or 1
    lines += [
        "",
        "### What runs out first",
        "",
        f"This machine's {cores} cores, shared by everything: every run spent "
        f"{min(per_request) * 1000:.0f}-{max(per_request) * 1000:.0f} ms of CPU per request "
        f"served over the whole run (the fleet's idle time included), the gateway "
        f"{min(gateway) * 1000:.1f}-{max(gateway) * 1000:.1f} ms of it. The steps show what that "
        f"sustains, whatever the fleet's size: every request served up to "
        f"{' / '.join(served_in_full(steps_of(r)) for r in runs)} req/s offered, end-to-end time "
        f"within {KEPT_E2E:g}x the day's up to {' / '.join(kept_text(r) for r in runs)} (the "
        f"rows above, in order). Past that, requests queue, then the fair queue refuses what "
        f"waited past a tenant's queue timeout (429/503) and the simulated frontends answer "
        f"503/504 themselves. Requests failed unanswered: "
        f"{sum(p.failed for r in runs for p in r['parts'])}; served requests missing from the "
        f"ledger: {sum(max(0, sum(p.served for p in r['parts']) - r['in_ledger']) for r in runs)}.",
    ]
    lines += [
        "",
        "### Where the cores went: CPU ms per request served, over the whole run",
        "",
        "| workers | " + " | ".join(labels) + " | all |",
        "|---|" + "---|" * (len(labels) + 1),
    ]
    for run in runs:
        served = max(1, sum(p.served for p in run["parts"]))
        cells = " | ".join(f"{run['cpu'].get(label, 0) / served * 1000:.2f}" for label in labels)
        every = sum(run["cpu"].values()) / served * 1000
        lines.append(f"| {run['label']} | {cells} | {every:.2f} |")
    labels = sorted({label for run in runs for label in run["peaks"]})
    lines += [
        "",
        "### Peak resident memory, MiB (the largest process of each kind)",
        "",
        "| workers | " + " | ".join(labels) + " |",
        "|---|" + "---|" * len(labels),
    ]
    for run in runs:
        cells = " | ".join(f"{run['peaks'].get(label, 0):.0f}" for label in labels)
        lines.append(f"| {run['label']} | {cells} |")
    return "\n".join(lines)


def steps_of(run: dict) -> list[Part]:
    return [p for p in run["parts"] if p.name.startswith("step")]


def kept_text(run: dict) -> str:
    kept = kept_rate(run)
    return f"{kept.offered:g}" if kept else f"below {steps_of(run)[0].offered:g}"


def served_in_full(steps: list[Part]) -> str:
    """The highest step (req/s offered) up to which every step served at
    least KEPT_SERVED of its requests, none refused or failed, however long
    they queued."""
    best = None
    for step in steps:
        if step.served < KEPT_SERVED * step.sent or step.refused or step.failed:
            break
        best = step
    return f"{best.offered:g}" if best else f"below {steps[0].offered:g}"


def why(missed: Part | None, day: Part) -> str:
    if missed is None:
        return "kept up with every step"
    reasons = []
    if pct(missed.e2e_ms, 50) > KEPT_E2E * pct(day.e2e_ms, 50):
        reasons.append(f"e2e p50 {pct(missed.e2e_ms, 50):.0f} ms")
    if missed.served < KEPT_SERVED * missed.sent:
        reasons.append(f"served {missed.served}/{missed.sent}")
    if missed.failed:
        reasons.append(f"{missed.failed} failed")
    if missed.ledger["lag"][1] > LAG_KEPT_S:
        reasons.append(f"lag p99 {missed.ledger['lag'][1]:.1f} s")
    return "; ".join(reasons)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="8,16,32,64")
    parser.add_argument("--tenants", type=int, default=2000)
    parser.add_argument("--day-seconds", type=float, default=60)
    parser.add_argument("--day-peak", type=float, default=40)
    parser.add_argument("--steps", default="30,45,60,75,90,105,120")
    parser.add_argument("--step-seconds", type=float, default=10)
    parser.add_argument("--speedup-ratio", type=float, default=1.0)
    parser.add_argument("--gateway-workers", type=int, default=2)
    parser.add_argument(
        "--compare-key-cache",
        default="5",
        help="the first size again with this key cache TTL (s), as before bench/fleet found it "
        "costly; empty: not",
    )
    parser.add_argument(
        "--report-only", action="store_true", help="report the last run's results again"
    )
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    sizes = [int(s) for s in args.sizes.split(",")]
    args.steps = [float(s) for s in args.steps.split(",")]
    if args.report_only:
        args, runs = pickle.loads(RESULTS.read_bytes())  # noqa: S301 (this bench's own file)
        return report_publish(runs, args)
    if not dynamo_installed():
        say("installing NVIDIA Dynamo (its own virtualenv, about a minute)")
        dynamo_install(progress=say)
    base = connection.settings_dict["NAME"]
    template, work = f"{base}_fleet_tpl", f"{base}_fleet"
    database_use(template, create=True)
    started = time.monotonic()
    call_command("migrate", verbosity=0)
    secrets = world_seed(args.tenants)
    seeded = time.monotonic() - started
    say(f"template migrated and seeded ({args.tenants} tenants) in {seeded:.0f} s")
    # Popularity is not creation order (the first two hold the reserved and dedicated pools).
    tail = secrets[2:]
    random.Random(5).shuffle(tail)  # noqa: S311 (a bench's draw)
    secrets[2:] = tail
    runs = []
    try:
        for size in sizes:
            database_copy(base, template, work)
            runs.append(size_run(size, secrets=secrets, args=args))
            if size == sizes[0] and args.compare_key_cache:
                database_copy(base, template, work)
                runs.append(
                    size_run(size, secrets=secrets, args=args, key_cache=args.compare_key_cache)
                )
    finally:
        database_use(base)
        databases_drop(work, template)
    RESULTS.write_bytes(pickle.dumps((args, runs)))
    report_publish(runs, args)


def report_publish(runs: list[dict], args) -> None:
    body = report(runs, args)
    report_write(
        name="fleet",
        title="A simulated GPU fleet at an operator's scale: NVIDIA Dynamo mocker workers "
        "(bench/fleet.py)",
        command=" ".join(["./dev bench fleet", *args.argv]),
        body=body,
    )


if __name__ == "__main__":
    main()
