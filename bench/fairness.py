"""bench/fairness: a noisy neighbour on one real vLLM-CPU replica, through
the gateway, driven by the official openai client (issue #17).

Scenario 1, arms in one run, each over the same measurement window:
  (a) a light tenant alone: one short streaming request every 200 ms;
  (b) the light tenant plus a heavy tenant keeping five times the replica's
      batch (vLLM's max_num_seqs) in flight with long outputs, fair queuing
      off (pass-through: vLLM's own first-come-first-served queue);
  (c) the same as (b) with fair queuing on, once per --max-inflight (the
      replica's slots at the gateway; the first one is the headline).
Scenario 2: two equal-weight tenants with different request sizes, both
backlogged, fair queuing on: their weighted service over the window.

Service, as the gateway's fair queue counts it: input + 2 x output tokens,
taken from vLLM's per-chunk usage (continuous usage stats) at the moment
each chunk reaches the client, so only what was delivered inside the window
counts.

    ./dev bench fairness [--seconds 30] [--max-inflight 64,16]

Prints a table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
django.setup()

import httpx  # noqa: E402
import openai  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.common import report_write  # noqa: E402
from bench.replica import tiny_replica_start  # noqa: E402
from core.processes import ManagedProcess  # noqa: E402
from serving.choices import ReplicaStatus  # noqa: E402
from serving.launcher import (  # noqa: E402
    replica_stop,
    replica_wait_ready,
)
from serving.models import Replica  # noqa: E402
from serving.services import (  # noqa: E402
    local_gpu_ensure,
    pool_ensure,
    replica_register,
)
from tenants.models import (  # noqa: E402
    MAX_QUEUED_REQUESTS_MAX,
    QUEUE_TIMEOUT_MS_MAX,
    ApiKey,
    Tenant,
    TenantPolicy,
)
from tenants.services import api_key_create, tenant_create  # noqa: E402
from tests.services import free_port  # noqa: E402

SERVED = "fairbench-tiny"  # its own model name: no other replica can serve it
REPLICA = "fairbench-vllm"
MAX_NUM_SEQS = 64
OUTPUT_WEIGHT = 2  # the gateway's VTC weight (serving/gateway/fairness.py)
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
            model=SERVED,
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


async def arm_drive(
    gateway: str,
    loads: dict[str, tuple[str, Shape]],
    *,
    ramp: float,  # ok-float
    seconds: float,  # ok-float
    grace: float,  # ok-float
) -> tuple[dict[str, Tally], Window]:
    """Every tenant's load at once: closed loops from now (the backlog builds
    during `ramp`), open loops from the window's start; light requests started
    in the window get `grace` seconds after it to finish."""
    tallies = {name: Tally() for name in loads}
    clients = {  # made first: building one takes a while on a loaded machine
        name: openai.AsyncOpenAI(
            base_url=f"{gateway}/v1", api_key=secret, max_retries=0, timeout=600
        )
        for name, (secret, _) in loads.items()
    }
    now = time.perf_counter()
    window = Window(now + ramp, now + ramp + seconds)
    try:
        await asyncio.gather(
            *(
                tenant_drive(clients[name], shape, tallies[name], window, window.end + grace)
                for name, (_, shape) in loads.items()
            )
        )
    finally:
        for client in clients.values():
            await client.close()
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


def gateway_start(*, fair: bool) -> tuple[ManagedProcess, str]:
    port = free_port()
    name = "on" if fair else "off"
    gateway = ManagedProcess(
        f"gateway-fq-{name}",
        [sys.executable, "manage.py", "gateway", "--port", str(port)],
        env={
            "REDIS_URL": "",  # one process: the fair queue in memory
            "GATEWAY_FAIR_QUEUING": "true" if fair else "false",
            "GATEWAY_FLEET_REFRESH_SECONDS": "0.5",
        },
        log_path=Path(settings.VAR_DIR) / "log" / f"bench-fairness-gateway-{name}.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    gateway.start()
    gateway.wait_ready(timeout=60)
    return gateway, f"http://127.0.0.1:{port}"


def max_inflight_set(n: int) -> None:
    Replica.objects.filter(name=REPLICA).update(max_inflight=n)
    time.sleep(2)  # the gateway's fleet refresh (0.5 s) resizes the replica's slots


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
        help="the replica's slots at the gateway in arm (c), comma-separated; the first "
        "is the headline",
    )
    parser.add_argument("--flood", type=int, default=5, help="heavy in flight, x max_num_seqs")
    args = parser.parse_args()
    slots = [int(n) for n in args.max_inflight.split(",")]
    say = lambda msg: print(msg, flush=True)  # noqa: E731
    random.seed(17)

    call_command("migrate", verbosity=0)
    secrets = {t: bench_tenant(f"fairbench-{t}") for t in ("light", "heavy", "small", "large")}
    vllm, model = tiny_replica_start(
        name="fairbench", served=SERVED, max_num_seqs=MAX_NUM_SEQS, say=say
    )
    gateways: list[ManagedProcess] = []
    light = Shape(prompt="Hi, a short one please.", min_tokens=16, max_tokens=16, every=0.2)
    heavy = Shape(
        prompt="Write a long essay about the sea. " * 4,
        min_tokens=128,
        max_tokens=384,
        concurrency=args.flood * MAX_NUM_SEQS,
    )
    arms: list[Arm] = []
    try:
        say("starting the vLLM-CPU replica and two gateways (fair queuing off / on) …")
        replica_wait_ready(vllm, timeout=600)
        replica_register(
            name=REPLICA,
            base_url=vllm.base_url,
            model=model,
            pool=pool_ensure(name="fairbench-shared"),
            gpus=[local_gpu_ensure(serial="fairbench")],
            max_inflight=slots[0],
        )
        off, off_url = gateway_start(fair=False)
        gateways.append(off)
        on, on_url = gateway_start(fair=True)
        gateways.append(on)
        time.sleep(2)

        def arm(
            label: str, url: str, loads: dict, ramp: float | None = None
        ) -> tuple[dict[str, Tally], Window]:
            say(f"{label} …")
            if ramp is None:
                backlog = any(shape.every is None for _, shape in loads.values())
                ramp = args.ramp if backlog else 0
            result = asyncio.run(
                arm_drive(url, loads, ramp=ramp, seconds=args.seconds, grace=args.grace)
            )
            vllm_wait_idle(vllm.base_url)
            return result

        warm = Shape(prompt=light.prompt, min_tokens=16, max_tokens=16, concurrency=4)
        for url in (off_url, on_url):
            asyncio.run(arm_drive(url, {"w": (secrets["light"], warm)}, ramp=0, seconds=3, grace=0))
        vllm_wait_idle(vllm.base_url)

        only = {"light": (secrets["light"], light)}
        both = {**only, "heavy": (secrets["heavy"], heavy)}
        tallies, window = arm("(a) light alone, fair queuing off", off_url, only)
        arms.append(Arm("(a) light alone, fair queuing off", tallies["light"], None, window))
        tallies, window = arm("(b) light + heavy flood, fair queuing off", off_url, both)
        arms.append(
            Arm("(b) + heavy, fair queuing off", tallies["light"], tallies["heavy"], window)
        )
        for n in slots:
            max_inflight_set(n)
            tallies, window = arm(f"(c) light + heavy flood, fair queuing on, N={n}", on_url, both)
            arms.append(
                Arm(
                    f"(c) + heavy, fair queuing on, N={n}",
                    tallies["light"],
                    tallies["heavy"],
                    window,
                )
            )

        # VTC keeps the counters within about N x the largest request's cost
        # of each other, and charges output when a request ends: the fewest
        # slots converge within a short window.
        pairs_slots = min(slots)
        max_inflight_set(pairs_slots)
        backlog = pairs_slots + 32  # each always has requests waiting at the gateway
        sizes = {
            "small": Shape(prompt="Short.", min_tokens=32, max_tokens=32, concurrency=backlog),
            "large": Shape(
                prompt="A much longer prompt about many things. " * 10,
                min_tokens=256,
                max_tokens=256,
                concurrency=backlog,
            ),
        }
        tallies, window = arm(
            f"scenario 2: small vs large requests, fair queuing on, N={pairs_slots}",
            on_url,
            {name: (secrets[name], shape) for name, shape in sizes.items()},
            ramp=args.pair_ramp,
        )
    finally:
        for gateway in reversed(gateways):
            gateway.stop()
        replica_stop(vllm.pid)
        Replica.objects.filter(name=REPLICA).update(status=ReplicaStatus.DOWN)

    report_write(
        name="fairness",
        title="Fair queuing with a noisy neighbour (bench/fairness.py)",
        command="./dev bench fairness",
        body=report(args, arms, tallies, window, slots, heavy, light),
    )


def report(args, arms: list[Arm], sizes: dict[str, Tally], window: Window, slots, heavy, light):
    alone, passthrough, headline = arms[0], arms[1], arms[2]
    small, large = sizes["small"], sizes["large"]
    spread = abs(small.service - large.service) / ((small.service + large.service) / 2)
    p99_ratio = headline.light.p("ttft_ms", 99) / alone.light.p("ttft_ms", 99)
    throughput_ratio = headline.total_tps / passthrough.total_tps
    lines = [
        f"One vLLM-CPU replica of the tiny model (max_num_seqs {MAX_NUM_SEQS}), one gateway "
        "process without Redis, the official `openai` client (streaming, per-chunk usage). "
        f"Light tenant: one request every {light.every * 1000:.0f} ms, {len(light.prompt)}-char "
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
        f"Scenario 2, fair queuing on, N={min(slots)}: two equal-weight tenants, both "
        f"backlogged ({min(slots) + 32} requests in flight each), over a {window.seconds:g} s "
        f"window after {args.pair_ramp:g} s of both running. The fair queue charges a "
        "request's output when it ends, so the counters "
        "agree within about N x the largest request's cost; with more slots each request also "
        "decodes slower and holds its slot longer (a large one: tens of seconds at N=64 on "
        "vLLM-CPU), so the fewest slots of the run are used.",
        "",
        "| tenant | request | requests started | weighted service | output tok/s |",
        "|---|---|---|---|---|",
        f"| small | 6-char prompt, 32 output tokens | {small.sent} | {small.service:,} | "
        f"{small.output / window.seconds:,.0f} |",
        f"| large | 400-char prompt, 256 output tokens | {large.sent} | {large.service:,} | "
        f"{large.output / window.seconds:,.0f} |",
        "",
        f"Weighted service apart by {spread:.1%} of their mean (target ±10%); Jain's index "
        f"{jain([small.service, large.service]):.3f}. Targets (issue #17): (c) light TTFT p99 "
        "at most 1.5x (a), total throughput at least 0.95x (b).",
        "",
        f"fairness: light_p99_ratio={p99_ratio:.2f} throughput_ratio={throughput_ratio:.2f}",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
