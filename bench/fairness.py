"""bench/fairness: a noisy neighbour on one real vLLM-CPU replica, through
the gateway, driven by the official openai client, for each model named
(`--models`, default the tiny model, then mem-llama-240m: a memory-bound
shape whose step grows little with the batch at first, as a GPU's does, on
a CPU that computes bf16 natively; then a simulated GPU).

Scenario 1, arms in one run, each over the same measurement window:
  (a) a light tenant alone: one short streaming request every 200 ms;
  (b) the light tenant plus a heavy tenant keeping five times the replica's
      batch (vLLM's max_num_seqs) in flight with long outputs, fair queuing
      off (pass-through: vLLM's own first-come-first-served queue);
  (c) the same as (b) with fair queuing on, once per fixed N (the
      replica's slots at the gateway; on the tiny model the first one is
      the headline);
  (e) the same with N found by the gateway (adaptive concurrency, up to
      max_num_seqs; the N it chose is sampled through the window): the
      headline on a memory-bound model;
  (d) the floor: vLLM alone, no gateway, holding as many heavy requests as
      the headline arm let it run.
Scenario 2 (tiny model): two equal-weight tenants with different request
sizes, both backlogged, fair queuing on: their weighted service over the
window. Each memory-bound section also measures the replica's decode step
against the batch first (vLLM's own inter-token latency), so the N the
gateway chose is set against the knee of the curve measured in the run.

Service, as the gateway's fair queue counts it: input + 2 x output tokens,
taken from vLLM's per-chunk usage (continuous usage stats) at the moment
each chunk reaches the client, so only what was delivered inside the window
counts.

    ./dev bench fairness [--seconds 30] [--max-inflight 64,16]
        [--models tiny,mem-llama-240m,gpu-sim]

Prints the tables and writes them to docs/benchmarks.md (one section per model)."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import logging
import math
import multiprocessing
import os
import random
import re
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()
# A line per request from the client's HTTP libraries would cost the flood's
# client real CPU on the cores vLLM and the gateway share.
for _name in ("httpx", "httpx2"):
    logging.getLogger(_name).setLevel(logging.WARNING)

import httpx  # noqa: E402
import openai  # noqa: E402
from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.common import bench_database, report_write  # noqa: E402
from bench.gpu_engine import GpuEngine  # noqa: E402
from bench.replica import tiny_replica_start  # noqa: E402
from bench.step_curve import step_ms  # noqa: E402
from billing.models import SloPolicy  # noqa: E402
from core.processes import ManagedProcess  # noqa: E402
from gateway.concurrency import PROMISE_SHARE  # noqa: E402
from metering.models import UsageEvent  # noqa: E402
from serving.choices import Concurrency, ReplicaStatus  # noqa: E402
from serving.launcher import (  # noqa: E402
    replica_stop,
    replica_wait_ready,
)
from serving.model_config import roofline_bytes  # noqa: E402
from serving.models import Replica, ServedModel  # noqa: E402
from serving.services import (  # noqa: E402
    local_gpu_ensure,
    pool_ensure,
    replica_register,
    served_model_ensure,
)
from serving.tiny_model import MEMORY_BOUND, MODEL_NAME, TINY, cpu_dtype, model_config  # noqa: E402
from tenants.choices import Tier  # noqa: E402
from tenants.models import (  # noqa: E402
    MAX_QUEUED_REQUESTS_MAX,
    QUEUE_TIMEOUT_MS_MAX,
    ApiKey,
    Tenant,
    TenantPolicy,
)
from tenants.services import api_key_create, tenant_create  # noqa: E402
from tests.services import free_port  # noqa: E402

# Each section's model under its own served name: no other replica serves it.
MODELS = {"tiny": (MODEL_NAME, TINY)} | {name: (name, s) for name, s in MEMORY_BOUND.items()}
GPU_SIM = "gpu-sim"  # bench/gpu_engine.py: an H200's measured step curve, simulated
MAX_NUM_SEQS = {"tiny": 64}  # else MEMORY_MAX_NUM_SEQS
MEMORY_MAX_NUM_SEQS = 32
LIGHT_SHARE = 0.1  # the light tenant asks at most this share of a replica's tokens
# The memory-bound project model: the flattest curve bench/step_curve.py
# measured on a CPU with native bf16 (1.18x a batch of 1 at 32, 2026-11-28).
MEMORY_MODEL = "mem-llama-240m"
KNEE_TOLERANCE = 1.3  # the knee: the largest batch whose step is within this of a batch of 1
OUTPUT_WEIGHT = 2  # the gateway's VTC weight (gateway/fairness.py)
FLOOD_NICE = 10  # the closed-loop (flooding) clients' CPU priority


def cores_split() -> tuple[str, set[int]]:
    """The replica's core (the last one) and the others', for the gateway
    and the clients: vLLM standing in for a GPU computes on its own core, as
    a GPU would not take the gateway's CPU. One core: no split."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        return "", set(cores)
    return str(cores[-1]), set(cores[:-1])


REPLICA_CPUS, HOST_CPUS = cores_split()
# Nobody's own limits stand in the way: no concurrency limit, the longest
# queue timeout and the largest queue bound a policy may have.
OPEN_POLICY = {
    "max_concurrent_requests": None,
    "requests_per_minute": None,
    "tokens_per_minute": None,
    "max_inflight_tokens": None,
    "fair_share_weight": 1,
    "queue_timeout_ms": QUEUE_TIMEOUT_MS_MAX,
    "max_queued_requests": MAX_QUEUED_REQUESTS_MAX,
}


@dataclass(frozen=True)
class Shape:
    """What one tenant sends: prompt, output length range, and either a
    fixed rate (open loop) or a number of requests kept in flight."""

    prompt: str
    min_tokens: int
    max_tokens: int
    every: float | None = None  # ok-float: seconds between requests (open loop)
    concurrency: int = 0  # requests kept in flight (closed loop)
    model: str = "fairbench-tiny"  # the served model's name


@dataclass
class Tally:
    """One tenant's requests in one arm: latencies of those started inside
    the window, service and output delivered inside it."""

    sent: int = 0
    errors: int = 0
    censored: int = 0  # no first token by the end of the arm: counted at what they waited
    ttft_ms: list[float] = field(default_factory=list)  # ok-float: timings
    e2e_ms: list[float] = field(default_factory=list)  # ok-float: timings
    service: int = 0  # input + 2 x output tokens delivered in the window
    output: int = 0  # output tokens delivered in the window
    asked_output: int = 0  # max_tokens of the requests started in the window
    prompt_tokens: int = 0  # of one request (the same prompt every time)

    @property
    def asked(self) -> int:
        """The service the requests started in the window asked for."""
        return self.sent * self.prompt_tokens + OUTPUT_WEIGHT * self.asked_output

    def p(self, which: str, q: float) -> float:  # ok-float
        values = sorted(getattr(self, which))
        if not values:
            return float("nan")
        return values[min(len(values) - 1, round(q / 100 * (len(values) - 1)))]


@dataclass(frozen=True)
class Window:
    start: float  # ok-float: perf_counter
    end: float  # ok-float: perf_counter
    wall_start: datetime | None = None  # the start on the ledger's clock

    def holds(self, t: float) -> bool:  # ok-float
        return self.start <= t < self.end

    @property
    def seconds(self) -> float:  # ok-float
        return self.end - self.start


async def request_stream(
    client: openai.AsyncOpenAI, shape: Shape, tally: Tally, window: Window
) -> bool:
    """One streaming request; False when it failed."""
    max_tokens = random.randint(shape.min_tokens, shape.max_tokens)  # noqa: S311
    started = time.perf_counter()
    counted = window.holds(started)
    first = None
    prompt_seen, output_seen = False, 0
    if counted:
        tally.sent += 1
        tally.asked_output += max_tokens
    try:
        stream = await client.chat.completions.create(
            model=shape.model,
            messages=[{"role": "user", "content": shape.prompt}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={
                "ignore_eos": True,  # exact output lengths (random weights may stop early)
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            },
        )
        async for chunk in stream:
            now = time.perf_counter()
            if first is None and chunk.choices:
                first = now
            usage = chunk.usage
            if usage is None:
                continue
            if not prompt_seen:
                prompt_seen = True
                tally.prompt_tokens = usage.prompt_tokens
                if window.holds(now):
                    tally.service += usage.prompt_tokens
            grew, output_seen = usage.completion_tokens - output_seen, usage.completion_tokens
            if grew and window.holds(now):
                tally.output += grew
                tally.service += OUTPUT_WEIGHT * grew
    except asyncio.CancelledError:
        if counted and first is None:  # still waiting when the arm ended: a lower bound
            waited = (time.perf_counter() - started) * 1000
            tally.censored += 1
            tally.ttft_ms.append(waited)
            tally.e2e_ms.append(waited)
        raise
    except openai.APIError:
        if counted:
            tally.errors += 1
        return False
    if counted and first is not None:
        ended = time.perf_counter()
        tally.ttft_ms.append((first - started) * 1000)
        tally.e2e_ms.append((ended - started) * 1000)
    return True


async def tenant_drive(
    client: openai.AsyncOpenAI, shape: Shape, tally: Tally, window: Window, stop: float
) -> None:
    """Send until `stop` (perf_counter), open or closed loop; requests still
    running then are cancelled by the caller."""
    if shape.every is not None:
        await asyncio.sleep(max(0.0, window.start - time.perf_counter()))
        running: set[asyncio.Task] = set()
        at = window.start
        try:
            while at < window.end:
                task = asyncio.create_task(request_stream(client, shape, tally, window))
                running.add(task)
                task.add_done_callback(running.discard)
                at += shape.every
                await asyncio.sleep(max(0.0, at - time.perf_counter()))
            if running:
                await asyncio.wait(running, timeout=max(0.0, stop - time.perf_counter()))
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)
        return

    async def loop() -> None:
        while time.perf_counter() < window.end:
            if not await request_stream(client, shape, tally, window):
                await asyncio.sleep(0.1)  # no tight loop against refusals

    workers = [asyncio.create_task(loop()) for _ in range(shape.concurrency)]
    await asyncio.sleep(max(0.0, stop - time.perf_counter()))
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


def tenant_process(conn, gateway: str, secret: str, shape: Shape, nice: int, seed: int) -> None:
    """One tenant's client in a process of its own: says it is ready, takes
    the window, drives the load, sends back its tally."""
    if nice:
        os.nice(nice)
    if REPLICA_CPUS:
        os.sched_setaffinity(0, HOST_CPUS)
    random.seed(seed)

    async def drive() -> Tally:
        client = openai.AsyncOpenAI(
            base_url=f"{gateway}/v1", api_key=secret, max_retries=0, timeout=600
        )
        conn.send("ready")
        start, end, stop = await asyncio.to_thread(conn.recv)
        tally = Tally()
        try:
            await tenant_drive(client, shape, tally, Window(start, end), stop)
        finally:
            await client.close()
        return tally

    conn.send(asyncio.run(drive()))


def arm_drive(
    gateway: str,
    loads: dict[str, tuple[str, Shape]],
    *,
    ramp: float,  # ok-float
    seconds: float,  # ok-float
    grace: float,  # ok-float
) -> tuple[dict[str, Tally], Window]:
    """Every tenant's load at once, each tenant's client in its own process
    (one event loop streaming a flood would delay the light tenant's timers
    and first tokens by its own lag). Closed loops start now (the backlog
    builds during `ramp`) at `FLOOD_NICE`, as their clients would sit on
    other machines; open loops start at the window's start at normal
    priority. Light requests started in the window get `grace` seconds after
    it to finish. perf_counter is the system's monotonic clock: one window
    for every process."""
    context = multiprocessing.get_context("spawn")
    children = {}
    for n, (name, (secret, shape)) in enumerate(loads.items()):
        ours, theirs = context.Pipe()
        nice = FLOOD_NICE if shape.every is None else 0
        process = context.Process(
            target=tenant_process,
            args=(theirs, gateway, secret, shape, nice, random.randrange(2**32) + n),  # noqa: S311
            daemon=True,
        )
        process.start()
        children[name] = (process, ours)
    try:
        for name, (_, conn) in children.items():
            if not conn.poll(120) or conn.recv() != "ready":
                raise RuntimeError(f"the {name} client did not start")
        now, wall = time.perf_counter(), timezone.now()
        window = Window(now + ramp, now + ramp + seconds, wall + timedelta(seconds=ramp))
        for _, conn in children.values():
            conn.send((window.start, window.end, window.end + grace))
        tallies = {}
        for name, (_, conn) in children.items():
            if not conn.poll(ramp + seconds + grace + 120):
                raise RuntimeError(f"the {name} client did not finish")
            tallies[name] = conn.recv()
    finally:
        for process, _ in children.values():
            process.join(timeout=30)
            if process.is_alive():
                process.kill()
    return tallies, window


def vllm_busy(base_url: str) -> float:  # ok-float: a gauge
    text = httpx.get(f"{base_url}/metrics", timeout=5).text
    return sum(
        float(m)
        for m in re.findall(r"^vllm:num_requests_(?:running|waiting)\{[^}]*\} (\S+)$", text, re.M)
    )


def vllm_wait_idle(base_url: str, *, timeout: float = 120) -> None:
    """Until the aborted requests of the last arm have left vLLM."""
    deadline = time.monotonic() + timeout
    while vllm_busy(base_url) and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)


def itl_promise_set(ms: float | None) -> None:  # ok-float: a latency bound
    """The shared tier's SLO policy with `ms` as its inter-token p95 promise,
    or none at all: the run holds to what its command line says."""
    SloPolicy.objects.filter(plan=None, tier=Tier.SHARED).delete()
    if ms is not None:
        SloPolicy.objects.create(
            name="fairbench shared", tier=Tier.SHARED, itl_p95_ms=Decimal(str(ms))
        )


def bench_tenant(slug: str) -> str:
    """A tenant with open limits and a fresh key (its secret)."""
    tenant = Tenant.objects.filter(slug=slug).first()
    if tenant is None:
        tenant = tenant_create(name=slug, slug=slug, policy=OPEN_POLICY)
    else:
        TenantPolicy.objects.filter(tenant=tenant).update(
            **OPEN_POLICY, budget_blocked_at=None, monthly_budget=None
        )
    ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True).update(revoked_at=timezone.now())
    _, secret = api_key_create(tenant=tenant, name="fairbench", scopes=["inference"])
    return secret


def taskset(cpus: set[int]) -> list[str]:
    return ["taskset", "-c", ",".join(map(str, sorted(cpus)))] if REPLICA_CPUS else []


def gateway_start(*, fair: bool) -> tuple[ManagedProcess, str, str]:
    port, operator_port = free_port(), free_port()
    name = "on" if fair else "off"
    gateway = ManagedProcess(
        f"gateway-fq-{name}",
        [
            *taskset(HOST_CPUS),
            *[sys.executable, "manage.py", "gateway", "--port", str(port)],
            *["--operator-port", str(operator_port)],
        ],
        env={
            "REDIS_URL": "",  # one process: the fair queue in memory
            "GATEWAY_FAIR_QUEUING": "true" if fair else "false",
            "GATEWAY_FLEET_REFRESH_SECONDS": "0.5",
        },
        log_path=Path(settings.VAR_DIR) / "log" / f"bench-fairness-gateway-{name}.log",
        ready_url=f"http://127.0.0.1:{operator_port}/healthz",  # every worker started
    )
    gateway.start()
    gateway.wait_ready(timeout=60)
    return gateway, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{operator_port}"


def max_inflight_set(replica: str, n: int, *, adaptive: bool = False) -> None:
    """Fixed N = n, or adaptive up to n (the gateway finds N)."""
    concurrency = Concurrency.ADAPTIVE if adaptive else Concurrency.FIXED
    Replica.objects.filter(name=replica).update(max_inflight=n, concurrency=concurrency)
    time.sleep(2)  # the gateway's fleet refresh (0.5 s) resizes the replica's slots


class NSampler:
    """The N the gateway holds a replica to, read from its operator
    /healthz every half second while an arm runs."""

    def __init__(self, operator_url: str, replica: str) -> None:
        self.url, self.replica = f"{operator_url}/healthz", replica
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                (worker,) = httpx.get(self.url, timeout=2).json()["workers"]
                self.samples.append(worker["concurrency"][self.replica]["n"])
            except (httpx.HTTPError, KeyError, ValueError):
                continue

    def __enter__(self) -> NSampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def summary(self) -> str:
        if not self.samples:
            return "not read"
        window = self.samples[len(self.samples) // 4 :]  # after the ramp's first part
        return f"{statistics.median(window):g} (from {min(window)} to {max(window)})"

    def median(self) -> int:
        window = self.samples[len(self.samples) // 4 :]
        return round(statistics.median(window)) if window else 0


def step_curve(base_url: str, served: str, batches: list[int], say) -> dict[int, float]:
    """The replica's decode step (vLLM's own mean inter-token latency, ms) at
    each batch, up to the first that takes twice a batch of one (past any
    knee: the larger ones would take minutes on a compute-bound CPU)."""
    steps = {}
    for size in batches:
        steps[size] = step_ms(base_url, served, size)
        say(f"  step at batch {size}: {steps[size]:.1f} ms")
        if steps[size] > 2 * steps[min(steps)]:
            break
    return steps


def knee(steps: dict[int, float]) -> float:  # ok-float: a batch, interpolated
    """Where the step first reaches KNEE_TOLERANCE x the step alone,
    interpolated linearly between the batches measured."""
    base = steps[min(steps)] * KNEE_TOLERANCE
    sizes = sorted(steps)
    for low, high in itertools.pairwise(sizes):
        if steps[high] > base >= steps[low]:
            return low + (high - low) * (base - steps[low]) / (steps[high] - steps[low])
    return float(sizes[-1])


def curve_at(steps: dict[int, float], batch: int) -> float:  # ok-float: ms
    """The step at `batch`, interpolated linearly between the batches measured."""
    sizes = sorted(steps)
    low = max((b for b in sizes if b <= batch), default=sizes[0])
    high = min((b for b in sizes if b >= batch), default=sizes[-1])
    if high == low:
        return steps[low]
    return steps[low] + (steps[high] - steps[low]) * (batch - low) / (high - low)


def backlogged_pct(slug: str, window: Window) -> float:  # ok-float
    """The share of the window the tenant had a request waiting in the
    gateway's queue (from the ledger: received, not yet sent to vLLM)."""
    start = window.wall_start
    end = start + timedelta(seconds=window.seconds)
    spans = sorted(
        (max(received, start), min(sent, end))
        for received, sent in UsageEvent.objects.filter(
            tenant__slug=slug, received_at__lt=end, sent_at__gt=start
        ).values_list("received_at", "sent_at")
    )
    covered, reach = timedelta(0), start
    for begin, finish in spans:
        if finish > reach:
            covered += finish - max(begin, reach)
            reach = finish
    return 100 * covered.total_seconds() / window.seconds


def jain(values: list[float]) -> float:  # ok-float
    if not values or not any(values):
        return float("nan")
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def jain_max_min(light: Tally, heavy: Tally) -> float:  # ok-float
    """Jain's index over the two equal-weight tenants, each one's service
    divided by its max-min fair share of what was delivered: the light tenant
    is owed what it asked for (under half), the heavy tenant the rest."""
    total = light.service + heavy.service
    light_share = min(light.asked, total / 2)
    if not light_share or total <= light_share:
        return float("nan")
    return jain([light.service / light_share, heavy.service / (total - light_share)])


@dataclass
class Arm:
    label: str
    light: Tally
    heavy: Tally | None
    window: Window

    @property
    def heavy_tps(self) -> float:  # ok-float
        return self.heavy.output / self.window.seconds if self.heavy else 0.0

    @property
    def total_tps(self) -> float:  # ok-float
        return self.light.output / self.window.seconds + self.heavy_tps


def held_at(slots: int) -> int:
    """How many of a replica's `slots` fair queuing lets one tenant hold
    (the rest is headroom for other tenants' first requests)."""
    return slots - math.floor(slots * settings.GATEWAY["SLOT_HEADROOM"])


def ms(value: float, censored: bool) -> str:  # ok-float
    return f"{'≥' if censored else ''}{value:,.0f}"


def arm_row(arm: Arm, alone: Arm, passthrough: Arm | None) -> str:
    light, cut = arm.light, arm.light.censored > 0
    ratio = f"{light.p('ttft_ms', 99) / alone.light.p('ttft_ms', 99):.2f}"
    throughput = (
        f"{arm.total_tps / passthrough.total_tps:.2f}" if passthrough and arm.heavy else "—"
    )
    fairness = f"{jain_max_min(light, arm.heavy):.3f}" if arm.heavy else "—"
    return (
        f"| {arm.label} | {light.sent} | {light.errors} | {light.censored} | "
        f"{ms(light.p('ttft_ms', 50), cut)} | {ms(light.p('ttft_ms', 99), cut)} | "
        f"{ms(light.p('e2e_ms', 50), cut)} | {ms(light.p('e2e_ms', 99), cut)} | "
        f"{ratio} | {arm.heavy_tps:,.0f} | {arm.total_tps:,.0f} | {throughput} | {fairness} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seconds", type=float, default=30, help="measurement window per arm")
    parser.add_argument("--ramp", type=float, default=5, help="heavy backlog builds first")
    parser.add_argument(
        "--adaptive-ramp",
        type=float,
        default=20,
        help="arm (e): the gateway's N converges under the heavy backlog this long first",
    )
    parser.add_argument(
        "--pair-ramp",
        type=float,
        default=15,
        help="scenario 2: both backlogs run this long before the window (the start-up "
        "transient, when one tenant's long requests hold the slots uncharged, stays out)",
    )
    parser.add_argument("--grace", type=float, default=5, help="light requests may finish")
    parser.add_argument(
        "--max-inflight",
        default="64,16",
        help="the tiny model's fixed N in arm (c), comma-separated; the first is the headline",
    )
    parser.add_argument(
        "--memory-max-inflight",
        default=str(MEMORY_MAX_NUM_SEQS),
        help="a memory-bound model's fixed N in arm (c), comma-separated",
    )
    parser.add_argument(
        "--models",
        default=f"tiny,{MEMORY_MODEL},{GPU_SIM}",
        help=f"comma-separated, of {', '.join([*MODELS, GPU_SIM])}",
    )
    parser.add_argument(
        "--gpu-scale",
        type=float,
        default=3.0,
        help=f"{GPU_SIM}: every step this many times the H200's (bench/gpu_engine.py)",
    )
    parser.add_argument(
        "--gpu-max-num-seqs",
        type=int,
        default=MEMORY_MAX_NUM_SEQS,
        help=f"{GPU_SIM}: the engine's max_num_seqs (and the adaptive arm's ceiling)",
    )
    parser.add_argument(
        "--itl-promise-ms",
        type=float,
        default=None,
        help="the shared tier's SLO policy promises this inter-token p95: the adaptive N "
        "may go past the knee while the mean step stays within 80%% of it (none: no promise)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="vLLM's token budget a step (chunked prefill), for the vLLM sections; "
        "none: vLLM's default",
    )
    parser.add_argument("--flood", type=int, default=5, help="heavy in flight, x max_num_seqs")
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=8,
        help="vLLM's --stream-interval in every arm: tokens per streamed chunk after the "
        "first, which is always sent at once",
    )
    args = parser.parse_args()
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    random.seed(17)

    bench_database("bench_fairness")  # a database of its own, migrated
    secrets = {t: bench_tenant(f"fairbench-{t}") for t in ("light", "heavy", "small", "large")}
    itl_promise_set(args.itl_promise_ms)
    tolerance = os.environ.get("GATEWAY_CONCURRENCY_TOLERANCE")
    setting = [f"GATEWAY_CONCURRENCY_TOLERANCE={tolerance}"] if tolerance else []
    command = " ".join([*setting, "./dev bench fairness", *sys.argv[1:]])
    for key in args.models.split(","):
        if key not in MODELS and key != GPU_SIM:
            parser.error(f"--models: {key!r} is none of {', '.join([*MODELS, GPU_SIM])}")
        tiny = key == "tiny"
        fixed = args.max_inflight if tiny else args.memory_max_inflight
        section = model_section(key, args, secrets, say, fixed=[int(n) for n in fixed.split(",")])
        if tiny:
            report_write(
                name="fairness",
                title="Fair queuing with a noisy neighbour (bench/fairness.py)",
                command=command,
                body=report(args, **section),
            )
        elif key == GPU_SIM:
            report_write(
                name="fairness_gpu_sim",
                title="Fair queuing with a noisy neighbour on a simulated GPU: an H200's "
                "measured step curve (bench/fairness.py, bench/gpu_engine.py)",
                command=command,
                body=report_memory(args, key, **section),
            )
        else:
            report_write(
                name=f"fairness_{key}",
                title=f"Fair queuing with a noisy neighbour on a memory-bound model, {key} "
                "(bench/fairness.py)",
                command=command,
                body=report_memory(args, key, **section)
                if "arms" in section
                else report_compute_bound(key, **section),
            )


def model_section(key: str, args, secrets: dict[str, str], say, *, fixed: list[int]) -> dict:
    """Every arm of scenario 1 on one replica of `key`'s model (and scenario
    2 on the tiny one): what the report needs."""
    tiny = key == "tiny"
    served, replica = f"fairbench-{key}", f"fairbench-vllm-{key}"
    max_num_seqs = (
        args.gpu_max_num_seqs if key == GPU_SIM else MAX_NUM_SEQS.get(key, MEMORY_MAX_NUM_SEQS)
    )
    if key == GPU_SIM:
        vllm, model = gpu_engine_start(served, max_num_seqs, args)
    else:
        model_name, model_shape = MODELS[key]
        vllm, model = tiny_replica_start(
            name=f"fairbench-{key}",
            served=served,
            max_num_seqs=max_num_seqs,
            say=say,
            cpus=REPLICA_CPUS,
            stream_interval=args.stream_interval,
            shape=replace(model_shape, dtype=cpu_dtype()),
            model_name=f"{model_name}-{cpu_dtype()}",
            max_num_batched_tokens=args.max_num_batched_tokens,
        )
    gateways: list[ManagedProcess] = []
    light = Shape(
        prompt="Hi, a short one please.", min_tokens=16, max_tokens=16, every=0.2, model=served
    )
    heavy = Shape(
        prompt="Write a long essay about the sea. " * 4,
        min_tokens=128,
        max_tokens=384,
        concurrency=args.flood * max_num_seqs,
        model=served,
    )
    arms: list[Arm] = []
    steps: dict[int, float] = {}
    chosen = NSampler("", replica)
    try:
        say(f"{key}: starting the replica and two gateways (fair queuing off / on) …")
        replica_wait_ready(vllm, timeout=900)
        replica_register(
            name=replica,
            base_url=vllm.base_url,
            model=model,
            pool=pool_ensure(name="fairbench-shared"),
            gpus=[local_gpu_ensure(serial=f"fairbench-{key}")],
            max_inflight=fixed[0],
        )
        # Adaptive from the start, as a replica is by default: the gateway's
        # controller reads the replica's steps all along (its floor from the
        # warm-up and the light arm), whichever gateway the traffic takes.
        max_inflight_set(replica, max_num_seqs, adaptive=True)
        off, off_url, _ = gateway_start(fair=False)
        gateways.append(off)
        on, on_url, on_operator = gateway_start(fair=True)
        gateways.append(on)
        time.sleep(2)

        def arm(
            label: str, url: str, loads: dict, ramp: float | None = None
        ) -> tuple[dict[str, Tally], Window]:
            say(f"{key}: {label} …")
            if ramp is None:
                backlog = any(shape.every is None for _, shape in loads.values())
                ramp = args.ramp if backlog else 0
            result = arm_drive(url, loads, ramp=ramp, seconds=args.seconds, grace=args.grace)
            vllm_wait_idle(vllm.base_url)
            return result

        warm = replace(light, every=None, concurrency=4)
        for url in (off_url, on_url):
            arm_drive(url, {"w": (secrets["light"], warm)}, ramp=0, seconds=3, grace=0)
        vllm_wait_idle(vllm.base_url)
        if key == GPU_SIM:  # the engine's curve, as set
            steps = {b: GpuEngine.curve_ms(b, args.gpu_scale) for b in (1, 2, 4, 8, 16, 32, 64)}
        else:  # the knee, measured in this run
            steps = step_curve(vllm.base_url, served, [1, 2, 4, 8, 16, 32, 64], say)
            vllm_wait_idle(vllm.base_url)
            if not tiny and knee(steps) < 2:
                say(f"{key}: compute-bound here (knee at b = {knee(steps):.1f}): no arms")
                return {"steps": steps, "max_num_seqs": max_num_seqs}

        # Light: at most LIGHT_SHARE of what the replica delivers at a full
        # batch (a slow replica's 16 tokens take seconds: every 200 ms would
        # make the light tenant a heavy one there).
        full = steps[max(b for b in steps if b <= max_num_seqs)] / 1000
        light = replace(
            light,
            every=max(light.every, light.max_tokens * full / (LIGHT_SHARE * max_num_seqs)),
        )
        only = {"light": (secrets["light"], light)}
        both = {**only, "heavy": (secrets["heavy"], heavy)}
        tallies, window = arm("(a) light alone, fair queuing off", off_url, only)
        arms.append(Arm("(a) light alone, fair queuing off", tallies["light"], None, window))
        tallies, window = arm("(b) light + heavy flood, fair queuing off", off_url, both)
        arms.append(
            Arm("(b) + heavy, fair queuing off", tallies["light"], tallies["heavy"], window)
        )
        for n in fixed:
            max_inflight_set(replica, n)
            label = f"(c) + heavy, fair queuing on, N={n} fixed"
            tallies, window = arm(label, on_url, both)
            arms.append(Arm(label, tallies["light"], tallies["heavy"], window))

        max_inflight_set(replica, max_num_seqs, adaptive=True)
        with NSampler(on_operator, replica) as chosen:
            label = f"(e) + heavy, fair queuing on, N adaptive (at most {max_num_seqs})"
            tallies, window = arm(label, on_url, both, ramp=args.adaptive_ramp)
        arms.append(Arm(label, tallies["light"], tallies["heavy"], window))
        say(f"{key}: the gateway's N through (e): {chosen.summary()}")

        # The floor no gateway can beat: vLLM alone holding as many heavy
        # requests as the headline arm let it run (the tiny model: fixed N
        # less the headroom; memory-bound: the N the gateway chose), the light
        # tenant straight to vLLM too. What the headline adds above this row
        # is the gateway's doing.
        held = held_at(fixed[0]) if tiny else max(1, chosen.median())
        direct = {
            "light": (secrets["light"], light),
            "heavy": (secrets["heavy"], replace(heavy, concurrency=held)),
        }
        engine = "the engine" if key == GPU_SIM else "vLLM"
        label = f"(d) straight to {engine}, heavy held at {held} in flight, no gateway"
        tallies, window = arm(label, vllm.base_url, direct)
        arms.append(Arm(label, tallies["light"], tallies["heavy"], window))

        result = {
            "arms": arms,
            "slots": fixed,
            "heavy": heavy,
            "light": light,
            "held": held,
            "chosen": chosen,
            "max_num_seqs": max_num_seqs,
            "steps": steps,
        }
        if not tiny:
            return result
        max_inflight_set(replica, fixed[0])
        backlog = fixed[0] + 32  # each always has requests waiting at the gateway
        sizes = {
            "small": Shape(
                prompt="Short.", min_tokens=32, max_tokens=32, concurrency=backlog, model=served
            ),
            "large": Shape(
                prompt="A much longer prompt about many things. " * 10,
                min_tokens=256,
                max_tokens=256,
                concurrency=backlog,
                model=served,
            ),
        }
        tallies, window = arm(
            f"scenario 2: small vs large requests, fair queuing on, N={fixed[0]}",
            on_url,
            {name: (secrets[name], shape) for name, shape in sizes.items()},
            ramp=args.pair_ramp,
        )
        backlogged = {name: backlogged_pct(f"fairbench-{name}", window) for name in sizes}
        return result | {"sizes": tallies, "window": window, "backlogged": backlogged}
    finally:
        for gateway in reversed(gateways):
            gateway.stop()
        if isinstance(vllm, ManagedProcess):
            vllm.stop()
        else:
            replica_stop(vllm.pid)
        Replica.objects.filter(name=replica).update(status=ReplicaStatus.DOWN)


class EngineProcess(ManagedProcess):
    """bench/gpu_engine.py in a process of its own, on the replica's core."""

    @property
    def base_url(self) -> str:
        return self.ready_url.removesuffix("/health")


def gpu_engine_start(served: str, max_num_seqs: int, args) -> tuple[EngineProcess, ServedModel]:
    port = free_port()
    engine = EngineProcess(
        "fairbench-gpu-sim",
        [
            *taskset({int(REPLICA_CPUS)} if REPLICA_CPUS else HOST_CPUS),
            *[sys.executable, "-m", "bench.gpu_engine", "--port", str(port)],
            *["--max-num-seqs", str(max_num_seqs), "--scale", str(args.gpu_scale)],
            *["--stream-interval", str(args.stream_interval)],
        ],
        log_path=Path(settings.VAR_DIR) / "log" / "bench-fairness-gpu-sim.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    engine.start()
    engine.wait_ready(timeout=60)
    model = served_model_ensure(name=served, chars_per_token=Decimal(1), max_context_tokens=2048)
    return engine, model


def step_estimates(
    alone: Arm, floor: Arm, light: Shape, held: int
) -> tuple[float, float]:  # ok-float
    """vLLM's step, ms: from the light tenant's decode alone (its tokens after
    the first) and from the heavy tenant's tokens a second with `held`
    requests running in the floor arm."""
    step_alone = (alone.light.p("e2e_ms", 50) - alone.light.p("ttft_ms", 50)) / (
        light.max_tokens - 1
    )
    step_full = held / floor.heavy_tps * 1000 if floor.heavy_tps else float("nan")
    return step_alone, step_full


def report(
    args,
    arms: list[Arm],
    sizes: dict[str, Tally],
    window: Window,
    slots,
    heavy,
    light,
    backlogged: dict[str, float],  # ok-float
    held: int,
    chosen: NSampler,
    max_num_seqs: int,
    steps: dict[int, float],  # ok-float
):
    alone, passthrough, headline, floor = arms[0], arms[1], arms[2], arms[-1]
    adaptive = arms[-2]
    step_alone, step_full = step_estimates(alone, floor, light, held)
    floor_ratio = floor.light.p("ttft_ms", 99) / alone.light.p("ttft_ms", 99)
    small, large = sizes["small"], sizes["large"]
    spread = abs(small.service - large.service) / ((small.service + large.service) / 2)
    p99_ratio = headline.light.p("ttft_ms", 99) / alone.light.p("ttft_ms", 99)
    throughput_ratio = headline.total_tps / passthrough.total_tps
    lines = [
        f"One vLLM-CPU replica of the tiny model (max_num_seqs {max_num_seqs}), one gateway "
        "process without Redis, the official `openai` client (streaming, per-chunk usage), "
        "each tenant's client in a process of its own. "
        + (
            f"vLLM (its server and engine) is bound to core {REPLICA_CPUS} and the gateway and "
            f"the clients to the rest, as a GPU would not compete with the gateway for CPU; "
            if REPLICA_CPUS
            else "One core: vLLM, the gateway and the clients share it; "
        )
        + f"the flooding (closed-loop) clients run at nice {FLOOD_NICE}, as they would sit on "
        "other machines. "
        + (
            f"vLLM streams {args.stream_interval} tokens a chunk after the first (its "
            f"`--stream-interval {args.stream_interval}`, every arm alike; the first token "
            "is always sent at once): its API server shares the engine's core. "
            if args.stream_interval > 1
            else "vLLM streams every token. "
        )
        + f"Light tenant: one request every {light.every * 1000:.0f} ms, {len(light.prompt)}-char "
        f"prompt, {light.max_tokens} output tokens. Heavy tenant: {heavy.concurrency} requests "
        f"kept in flight ({args.flood}x max_num_seqs), {len(heavy.prompt)}-char prompt, "
        f"{heavy.min_tokens}-{heavy.max_tokens} output tokens (uniform), no concurrency limit. "
        f"Each arm: {args.ramp:g} s for the heavy backlog to build, then a {args.seconds:g} s "
        f"window; light requests started in it get {args.grace:g} s more to finish, then "
        "everything is cancelled. N is the replica's `max_inflight` (slots at the gateway). "
        "Tokens/s are output tokens delivered inside the window. ≥: some light requests had "
        "no first token when the arm ended and count at what they had waited (a lower bound). "
        "Jain's index: over the two equal-weight tenants, each one's service (input + 2 x "
        "output tokens) divided by its max-min fair share (the light tenant asks for less "
        "than half, so it is owed all it asked for; 1.0 = fair).",
        "",
        "| arm | light sent | errors | no first token | light TTFT p50 ms | TTFT p99 ms | "
        "e2e p50 ms | e2e p99 ms | TTFT p99 / (a) | heavy tok/s | total tok/s | total / (b) | "
        "Jain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(arm_row(arm, alone, passthrough) for arm in arms),
        "",
        f"Row (d) is the floor: no gateway, the light tenant straight to vLLM while vLLM "
        f"holds {held} heavy requests, as many as fair queuing keeps in it at N={slots[0]}. "
        f"A request that joins a running batch waits for the step under way, then runs its "
        f"prefill in a step of the whole batch: here one decode step took "
        f"{step_alone:.1f} ms alone and {step_full:.1f} ms with {held} running "
        f"({step_full / step_alone:.1f}x; vLLM-CPU is compute-bound, where a GPU's memory-"
        f"bound step grows far less with the batch). vLLM alone gives the light tenant "
        f"{floor_ratio:.2f}x its TTFT p99 alone; (c) at N={slots[0]} adds "
        f"{headline.light.p('ttft_ms', 99) - floor.light.p('ttft_ms', 99):+.0f} ms over it.",
        "",
        f"Row (e): the gateway finds N itself (adaptive concurrency, at most {max_num_seqs}; "
        f"the light tenant may be admitted past it while under its share: the fair queue's "
        f"overflow, GATEWAY_SLOT_OVERFLOW). The N it held the replica to through the arm, "
        f"median of its /healthz read every 0.5 s: {chosen.summary()}, against the knee "
        f"of the step curve measured before the arms (where a step reaches "
        f"{KNEE_TOLERANCE}x a batch of 1, interpolated): b = {knee(steps):.1f} "
        f"({curve_cells(steps)} ms at b = {', '.join(map(str, steps))}). It gave the light "
        f"tenant {adaptive.light.p('ttft_ms', 99) / alone.light.p('ttft_ms', 99):.2f}x its "
        f"TTFT p99 alone at {adaptive.total_tps / passthrough.total_tps:.2f}x pass-through "
        "throughput: on this compute-bound model the step grows with every sequence, so "
        "the knee is a small batch and holding the replica there gives up throughput (the "
        "fixed N=64 row keeps it).",
        "",
        f"Scenario 2, fair queuing on, N={slots[0]}: two equal-weight tenants, both "
        f"backlogged ({slots[0] + 32} requests in flight each), over a {window.seconds:g} s "
        f"window after {args.pair_ramp:g} s of both running. The fair queue charges output "
        "as it streams, so the two counters stay within about one request's prompt of each "
        "other; what each was delivered in the window is counted from the stream's usage. "
        "The fair queue shares service among tenants with requests waiting at the gateway: "
        "the last column says how much of the window each one had. A tenant whose queue "
        "empties forfeits (the freed slots go to the other, work-conserving, and it rejoins "
        "at the backlogged minimum: no hoarded credit), so where a column is under 100 the "
        "split measures the load generator as much as the queue. Traced in the gateway on "
        "2026-11-23: the two tenants' counters within 1% of each other throughout.",
        "",
        "| tenant | request | requests started | weighted service | output tok/s | "
        "backlogged at the gateway, % of the window |",
        "|---|---|---|---|---|---|",
        f"| small | 6-char prompt, 32 output tokens | {small.sent} | {small.service:,} | "
        f"{small.output / window.seconds:,.0f} | {backlogged['small']:.1f} |",
        f"| large | 400-char prompt, 256 output tokens | {large.sent} | {large.service:,} | "
        f"{large.output / window.seconds:,.0f} | {backlogged['large']:.1f} |",
        "",
        f"Weighted service apart by {spread:.1%} of their mean (target ±10%); Jain's index "
        f"{jain([small.service, large.service]):.3f}. Targets: (c) light TTFT p99 "
        "at most 1.5x (a), total throughput at least 0.95x (b).",
        "",
        f"fairness: light_p99_ratio={p99_ratio:.2f} throughput_ratio={throughput_ratio:.2f}",
        "",
        f"fairness floor (vLLM alone, no gateway): light_p99_ratio={floor_ratio:.2f}",
    ]
    return "\n".join(lines)


def report_memory(
    args,
    key: str,
    arms: list[Arm],
    slots,
    heavy,
    light,
    held: int,
    chosen: NSampler,
    max_num_seqs: int,
    steps: dict[int, float],  # ok-float
) -> str:
    """The memory-bound model's section, ending in its summary line."""
    alone, passthrough, headline, floor = arms[0], arms[1], arms[-2], arms[-1]
    base = alone.light.p("ttft_ms", 99)
    step_alone, step_full = step_estimates(alone, floor, light, held)
    if key == GPU_SIM:
        engine = (
            f"One simulated GPU replica (bench/gpu_engine.py: vLLM's continuous batching and "
            f"its /metrics, each step a Llama-8B's on an H200 as bench/device_steps.py "
            f"measured it, x {args.gpu_scale:g} so that two cores can carry its tokens; "
            f"max_num_seqs {max_num_seqs}), in a process of its own on core "
            f"{REPLICA_CPUS or 'shared'}"
        )
        curve_source = "The engine's decode step (as set; x: over b = 1):"
    else:
        weights_mib = roofline_bytes(model_config(MODELS[key][1]))[0] / 2**20
        engine = (
            f"One vLLM-CPU replica of {key} ({weights_mib:,.0f} MiB of {cpu_dtype()} dummy "
            f"weights, max_num_seqs {max_num_seqs}"
            + (
                f", at most {args.max_num_batched_tokens} tokens a step: longer prompts are "
                "prefilled in chunks"
                if args.max_num_batched_tokens
                else ""
            )
            + f") on core {REPLICA_CPUS or 'shared'}"
        )
        curve_source = (
            "The replica's decode step in this run (vLLM's own mean inter-token latency, "
            "64-token requests, b at once; x: over b = 1):"
        )
    lines = [
        f"{engine}, the gateway "
        f"and the clients on the rest, everything else as in the tiny model's section: "
        f"light tenant one request every {light.every * 1000:.0f} ms of {light.max_tokens} "
        f"output tokens (every 200 ms, or less often where that would be more than "
        f"{LIGHT_SHARE:.0%} of the tokens the replica delivers at a full batch); heavy tenant "
        f"{heavy.concurrency} requests kept in flight "
        f"({args.flood}x max_num_seqs) of {heavy.min_tokens}-{heavy.max_tokens} output "
        f"tokens; {args.seconds:g} s windows. Arm (e)'s backlog runs {args.adaptive_ramp:g} s "
        "before its window, for the gateway's N to settle.",
        "",
        curve_source,
        "",
        *curve_table(steps),
        "",
        f"The knee (where the step reaches {KNEE_TOLERANCE}x a batch of 1, interpolated): "
        f"b = {knee(steps):.1f}. The N the gateway chose through arm (e) ({allowed(args)}), "
        f"median of its /healthz read every 0.5 s: {chosen.summary()}.",
        "",
        "| arm | light sent | errors | no first token | light TTFT p50 ms | TTFT p99 ms | "
        "e2e p50 ms | e2e p99 ms | TTFT p99 / (a) | heavy tok/s | total tok/s | total / (b) | "
        "Jain |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *(arm_row(arm, alone, passthrough) for arm in arms),
        "",
        f"Row (d) is the floor: the engine alone holding {held} heavy requests (the N the gateway "
        f"chose in (e)); one decode step took {step_alone:.1f} ms alone and {step_full:.1f} "
        f"ms with {held} running. The engine alone gives the light tenant "
        f"{floor.light.p('ttft_ms', 99) / base:.2f}x its TTFT p99 alone; (e) adds "
        f"{headline.light.p('ttft_ms', 99) - floor.light.p('ttft_ms', 99):+.0f} ms over it. "
        "Targets: (e) light TTFT p99 at most 1.5x (a), total throughput at least 0.95x (b).",
        *([] if key == GPU_SIM else ["", prefill_note(steps, held, step_full, heavy)]),
        "",
        f"fairness ({'simulated GPU' if key == GPU_SIM else 'memory-bound model'}): "
        f"light_p99_ratio="
        f"{headline.light.p('ttft_ms', 99) / base:.2f} "
        f"throughput_ratio={headline.total_tps / passthrough.total_tps:.2f}",
    ]
    return "\n".join(lines)


def allowed(args) -> str:
    """What the adaptive arm's N was held to, in words."""
    knee_at = (
        f"a step at most {settings.GATEWAY['CONCURRENCY_TOLERANCE']:g}x its floor, "
        "GATEWAY_CONCURRENCY_TOLERANCE"
    )
    if args.itl_promise_ms is None:
        return knee_at
    return (
        f"{knee_at}, or up to {PROMISE_SHARE:g} x the shared tier's inter-token p95 promise "
        f"of {args.itl_promise_ms:g} ms where that is more"
    )


def prefill_note(steps: dict[int, float], held: int, step_full: float, heavy) -> str:  # ok-float
    """How much of the floor's step the heavy requests' prefills take: the
    curve above is decode alone, the floor's steps carry the prefills."""
    decode = curve_at(steps, held)
    return (
        f"The floor's step ({step_full:.1f} ms a token with {held} heavy requests running) is "
        f"{step_full / decode:.2f}x the curve's decode step at that batch ({decode:.1f} ms): "
        f"each heavy request starts with a prefill of its {len(heavy.prompt)}-token prompt "
        "(byte-level tokens), compute-bound on a CPU where decode is not, so every few "
        "seconds a step carries one, and a light request arriving then waits it out: what "
        "sets the floor of row (d). On an H200 a 128-token prompt took 9.1 ms, 1.4 decode "
        "steps of a batch of one (bench/device_steps.py)."
    )


def curve_table(steps: dict[int, float]) -> list[str]:  # ok-float
    """The step at each batch, and over a batch of one, as a Markdown table."""
    cells = " | ".join(f"{steps[b]:.1f} ({steps[b] / steps[min(steps)]:.2f}x)" for b in steps)
    return [
        "| b | " + " | ".join(str(b) for b in steps) + " |",
        "|---|" + "---|" * len(steps),
        f"| step ms | {cells} |",
    ]


def curve_cells(steps: dict[int, float]) -> str:  # ok-float
    return ", ".join(f"{steps[b]:.1f}" for b in steps)


def report_compute_bound(key: str, steps: dict[int, float], max_num_seqs: int) -> str:  # ok-float
    """A memory-bound shape that is not memory-bound on this machine: its
    curve, and why no arm ran."""
    flags = "AVX-512 BF16" if cpu_dtype() == "bfloat16" else "no AVX-512 BF16 or AMX"
    return "\n".join(
        [
            f"One vLLM-CPU replica of {key} ({cpu_dtype()} dummy weights, max_num_seqs "
            f"{max_num_seqs}) on core {REPLICA_CPUS or 'shared'}; its decode step in this run "
            "(vLLM's own mean inter-token latency, 64-token requests, b at once; x: over "
            "b = 1):",
            "",
            *curve_table(steps),
            "",
            f"On this CPU ({flags}) the step grows with every sequence: the knee (where it "
            f"reaches {KNEE_TOLERANCE}x a batch of 1) is at b = {knee(steps):.1f}, so the "
            "engine is compute-bound at any batch and the fairness arms would measure a "
            "regime no GPU serves in. They were not run; the simulated GPU's section "
            "carries the memory-bound measurement.",
        ]
    )


if __name__ == "__main__":
    main()
