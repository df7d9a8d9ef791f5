"""The gateway's spend hold alone (issue 18): SpendGuard.reserve and
settle on in-process accounts, a flat card and a tiered one, in a loop,
side by side with the pricing it calls (`usage_nanos` for a flat card of
whole nano-unit prices, `usage_amount` otherwise) on its own. No
database, no network: what one held request costs the gateway's CPU
before any of its other work. Writes its table to docs/benchmarks.md.

    ./dev bench spend_hold [--requests N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
django.setup()

from bench.common import report_write  # noqa: E402
from billing.pricing.rating import RateCard, usage_amount, usage_nanos  # noqa: E402
from billing.pricing.spend_terms import SpendAccount, SpendTerms  # noqa: E402
from core.spend_accounts import LocalSpend  # noqa: E402
from gateway.spend import SpendGuard  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=50_000)
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
    body = (
        f"{args.requests:,} held requests in a loop, one process, accounts in memory "
        "(no gateway around them: the bench gateway row measures that).\n\n"
        "| card (its pricing) | reserve + settle µs / request | pricing µs / call "
        "| pricing's share |\n"
        "|---|---|---|---|\n" + "\n".join(rows)
    )
    report_write(
        name="spend_hold",
        title="The spend hold alone (issue 18)",
        command=f"./dev bench spend_hold --requests {args.requests}",
        body=body,
    )


if __name__ == "__main__":
    main()
