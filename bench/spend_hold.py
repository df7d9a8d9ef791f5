"""The gateway's spend hold, in two parts.

In a loop: SpendGuard.reserve and settle on in-process accounts, a flat
card and a tiered one, side by side with the pricing it calls
(`usage_nanos` for a flat card of whole nano-unit prices, `usage_amount`
otherwise) on its own. No database, no network.

In a running gateway (bench.timed_gateway, accounts in memory) at the
ceiling against the instant fake upstream: the CPU time reserve and
settle take per held request there, where caches are cold, beside the
gateway's whole CPU per request. Their share of it is what the hold takes
off the gateway's ceiling, measured inside the process, free of the noise
of throughput on two shared cores (bench gateway's held rows).

Writes its tables to docs/benchmarks.md.

    ./dev bench spend_hold [--requests N] [--gateway-requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import psutil  # noqa: E402
from django.conf import settings  # noqa: E402

from bench.common import bench_database, report_write  # noqa: E402
from bench.gateway import (  # noqa: E402
    FAKE_MODEL,
    bench_tenant,
    cpu_seconds,
    fake_replica_register,
    fake_upstream,
    held_tenant_secrets,
    run,
)
from billing.pricing.rate_card import RateCard, usage_amount, usage_nanos  # noqa: E402
from billing.spend.accounts import LocalSpend  # noqa: E402
from billing.spend.terms import SpendAccount, SpendTerms  # noqa: E402
from core.processes import ManagedProcess  # noqa: E402
from gateway.spend import SpendGuard  # noqa: E402
from serving.services import (  # noqa: E402
    served_model_ensure,
)
from tests.services import free_port  # noqa: E402

ROUNDS = 4

D = Decimal
FLAT = RateCard(
    steps={
        "input": ((0, D("0.50")),),
        "cached_input": ((0, D("0.25")),),
        "output": ((0, D("1.50")),),
    }
)
TIERED = RateCard(
    steps={
        "input": ((0, D("0.50")), (1_000_000, D("0.40"))),
        "cached_input": ((0, D("0.25")),),
        "output": ((0, D("1.50")), (1_000_000, D("1.20"))),
    }
)


def terms(card: RateCard) -> SpendTerms:
    now = datetime.now(UTC)
    account = SpendAccount(kind="budget", key="t1:budget", since=now, limit=D(10**9), spent=D(0))
    return SpendTerms(
        tenant_id=1,
        period_start=now,
        period_end=now + timedelta(days=30),
        currency="USD",
        accounts=(account,),
        cards={"m": card},
        volume={"m": {"input": 999_000, "output": 999_900}},
    )


async def hold_loop(card: RateCard, n: int) -> float:
    """µs per request for reserve + settle."""
    guard, held = SpendGuard(LocalSpend(), lease_seconds=600), terms(card)

    async def one(i: int) -> None:
        hold = await guard.reserve(
            held,
            model="m",
            request_id=f"r{i}",
            prompt_tokens_max=800,
            output_tokens_max=256,
            choices=1,
        )
        await guard.settle(hold, prompt=600, cached=100, completion=200, received_at=time.time())

    for i in range(n // 10):  # warm up
        await one(-i - 1)
    started = time.perf_counter()
    for i in range(n):
        await one(i)
    return (time.perf_counter() - started) / n * 1e6


def pricing_loop(card: RateCard, n: int) -> float:
    """µs per call of the pricing reserve and settle each call: usage_nanos
    for a flat card of whole nano-unit prices, usage_amount otherwise."""
    done = {"input": 999_000, "output": 999_900}
    started = time.perf_counter()
    if card.flat_nanos is not None:
        for _ in range(n):
            usage_nanos(card, prompt=600, cached=100, completion=200)
    else:
        for _ in range(n):
            usage_amount(card, done=done, prompt=600, cached=100, completion=200)
    return (time.perf_counter() - started) / n * 1e6


def in_gateway(requests: int) -> list[str]:
    """Rows of the held arms in a running gateway: its CPU per request,
    reserve's and settle's, and their share of it."""
    bench_database("bench_spend_hold")  # a database of its own, migrated
    _tenant, secret = bench_tenant()
    arms = {"no budget": secret, **held_tenant_secrets(served_model_ensure(name=FAKE_MODEL))}
    fake, fake_port = fake_upstream(32)
    port, operator_port = free_port(), free_port()
    out = Path(tempfile.mkdtemp(prefix="spend-hold-")) / "hold.json"
    gateway = ManagedProcess(
        "timed-gateway",
        [sys.executable, "-m", "bench.timed_gateway", "--port", str(port), "--out", str(out)],
        env={"REDIS_URL": "", "GATEWAY_OPERATOR_PORT": str(operator_port)},
        log_path=Path(settings.VAR_DIR) / "log" / "bench-timed-gateway.log",
        ready_url=f"http://127.0.0.1:{operator_port}/healthz",
    )
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    cpu = dict.fromkeys(arms, 0.0)
    try:
        fake.start()
        fake.wait_ready(timeout=30)
        fake_replica_register(fake_port)
        gateway.start()
        gateway.wait_ready(timeout=60)
        process = psutil.Process(gateway.pid)
        time.sleep(3)  # the fleet refresh picks up the fake replica
        for n in range(ROUNDS + 1):  # a round to warm up, then the arms taking turns
            names = list(arms)[n % len(arms) :] + list(arms)[: n % len(arms)]
            for name in names:
                before = cpu_seconds(process)
                result = run(name, url, model=FAKE_MODEL, tokens=32, stream=False,
                             requests=requests // ROUNDS, concurrency=64,
                             headers={"Authorization": f"Bearer {arms[name]}"})  # fmt: skip
                if result.errors:
                    raise RuntimeError(f"{name}: {result.errors} requests failed")
                if n:
                    cpu[name] += cpu_seconds(process) - before
            if not n:
                os.kill(gateway.pid, signal.SIGUSR1)  # what the warm-up spent
                time.sleep(0.5)
                warm = json.loads(out.read_text())
        os.kill(gateway.pid, signal.SIGUSR1)
        time.sleep(0.5)
        totals = json.loads(out.read_text())
    finally:
        gateway.stop()
        fake.stop()
    held = len(arms) - 1
    per_arm = requests // ROUNDS * ROUNDS
    hold = {
        name: (totals[name][0] - warm[name][0]) / (totals[name][1] - warm[name][1]) * 1e6
        for name in ("reserve", "settle")
    }
    base = cpu["no budget"] / per_arm * 1e6
    spent = hold["reserve"] + hold["settle"]
    rows = [
        f"| {name} | {base:.0f} | {hold['reserve']:.1f} | {hold['settle']:.1f} | "
        f"x {base / (base + spent):.3f} | {cpu[name] / per_arm * 1e6:.0f} "
        f"(x {cpu['no budget'] / cpu[name]:.3f}) |"
        for name in list(arms)[1:]
    ]
    return [
        f"{per_arm:,} requests per arm, 64 concurrent, the arms taking turns in {ROUNDS} "
        f"rounds after one to warm up; reserve and settle timed over the {held} held arms "
        "(their mean per call). The ceiling the hold leaves: one core over the CPU per "
        "request without a hold, and with the hold's own time added. The whole gateway's "
        "CPU per held request is beside it for reference: on this machine two identical "
        "arms' parts differ by up to a quarter, more than the hold costs.",
        "",
        "| held arm | no budget µs CPU / req | reserve µs | settle µs | "
        "ceiling ratio the hold leaves | held µs CPU / req, whole gateway (ratio) |",
        "|---|---|---|---|---|---|",
        *rows,
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--gateway-requests", type=int, default=12_000, help="per arm")
    args = parser.parse_args()
    rows = []
    cards = (
        ("flat card (usage_nanos)", FLAT),
        ("tiered card, a boundary crossed (usage_amount)", TIERED),
    )
    for label, card in cards:
        hold = asyncio.run(hold_loop(card, args.requests))
        price = pricing_loop(card, args.requests)
        rows.append(f"| {label} | {hold:.2f} | {price:.2f} | {2 * price / hold:.0%} |")
    print("\n".join(rows), flush=True)
    print("in a running gateway …", flush=True)
    in_situ = in_gateway(args.gateway_requests)
    body = "\n".join(
        [
            f"In a loop: {args.requests:,} held requests, one process, accounts in memory.",
            "",
            "| card (its pricing) | reserve + settle µs / request | pricing µs / call "
            "| pricing's share |",
            "|---|---|---|---|",
            *rows,
            "",
            "In a running gateway (bench.timed_gateway, accounts in memory), the instant "
            "fake upstream, a flat card of whole nano-unit prices: reserve's and settle's "
            "own CPU time (time.thread_time) per held request, beside the gateway's whole "
            "CPU per request (user + system, every thread).",
            "",
            *in_situ,
        ]
    )
    print(body)
    report_write(
        name="spend_hold",
        title="The spend hold",
        command=f"./dev bench spend_hold --requests {args.requests} "
        f"--gateway-requests {args.gateway_requests}",
        body=body,
    )


if __name__ == "__main__":
    main()
