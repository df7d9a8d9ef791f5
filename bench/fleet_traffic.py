"""bench/fleet_traffic: the fleet bench's load, in a process of its own (no
Django): thousands of tenants calling the gateway with their own keys,
open loop, in two shapes.

- A compressed day: the offered rate follows a day's curve (a quarter of
  the peak at night, the peak at midday), tenants drawn by a Zipf law (a
  few large, a long tail), and bursts: now and then one tenant sends a
  few dozen requests at once.
- Steps: a flat offered rate per step, rising, to find what the pipeline
  keeps up with.

Requests vary as production's do: prompts of a few to a few hundred
words, 16 to 256 output tokens, a third of them streamed. Each request's
wall-clock start and end (epoch seconds, to set beside the ledger's
timestamps) and its HTTP status (0: no answer) come back."""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import math
import random
import time
from dataclasses import dataclass

import aiohttp

WORDS = ("the quick brown fox jumps over a lazy dog while seven tenants share one fleet").split()  # noqa: SIM905
OUTPUT_TOKENS = ((16, 3), (32, 3), (64, 4), (128, 2), (256, 1))  # (max_tokens, weight)
STREAMED = 1 / 3  # ok-float: a share of requests
ZIPF_S = 1.1  # ok-float: the tenants' popularity law
BURSTS_PER_SECOND = 0.25  # ok-float: how often some tenant bursts
BURST_SIZE = (10, 40)
NIGHT = 0.25  # ok-float: the night's rate, as a share of the peak
TIMEOUT_S = 120


@dataclass(frozen=True)
class Plan:
    """What to send: `day_seconds` of a compressed day peaking at
    `day_peak` requests a second, then each rate of `steps` for
    `step_seconds` (either part may be empty)."""

    gateway: str
    model: str
    secrets: list[str]  # one bearer secret per tenant, most popular first
    day_seconds: float = 0  # ok-float: seconds
    day_peak: float = 0  # ok-float: requests a second
    steps: tuple[float, ...] = ()  # ok-float: requests a second
    step_seconds: float = 10  # ok-float: seconds
    seed: int = 11


def day_rate(t: float, *, seconds: float, peak: float) -> float:  # ok-float
    """The offered rate `t` seconds into a compressed day of `seconds`:
    NIGHT x peak at its ends, the peak at its middle."""
    return peak * (NIGHT + (1 - NIGHT) * math.sin(math.pi * t / seconds) ** 2)


def arrivals(plan: Plan, rng: random.Random) -> list[tuple[float, int, str]]:  # ok-float
    """(offset s, tenant index, part) for every request of the plan, sorted:
    Poisson arrivals at the day's rate (thinning against its peak) with
    bursts, then the steps' Poisson arrivals."""
    weights = list(itertools.accumulate(1 / (k + 1) ** ZIPF_S for k in range(len(plan.secrets))))

    def tenant() -> int:
        return min(len(weights) - 1, bisect.bisect(weights, rng.random() * weights[-1]))

    out: list[tuple[float, int, str]] = []
    t = 0.0
    while plan.day_peak > 0:
        t += rng.expovariate(plan.day_peak)
        if t >= plan.day_seconds:
            break
        if rng.random() < day_rate(t, seconds=plan.day_seconds, peak=plan.day_peak) / plan.day_peak:
            out.append((t, tenant(), "day"))
    for second in range(int(plan.day_seconds)):
        if rng.random() < BURSTS_PER_SECOND:
            who = rng.randrange(len(plan.secrets))  # anyone, the tail included
            out += [(second + rng.random() * 0.2, who, "day")] * rng.randint(*BURST_SIZE)
    start = plan.day_seconds
    for n, rate in enumerate(plan.steps):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= plan.step_seconds:
                break
            out.append((start + t, tenant(), f"step{n}"))
        start += plan.step_seconds
    return sorted(out)


def body(rng: random.Random, model: str) -> tuple[bytes, bool]:
    words = max(3, int(rng.lognormvariate(3.5, 1.0)))
    prompt = " ".join(rng.choice(WORDS) for _ in range(min(words, 600)))
    max_tokens = rng.choices([t for t, _ in OUTPUT_TOKENS], [w for _, w in OUTPUT_TOKENS])[0]
    stream = rng.random() < STREAMED
    payload = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload).encode(), stream


async def drive(plan: Plan) -> list[tuple[str, float, float, int]]:  # ok-float
    """Send the plan; (part, start, end, status) per request, epoch seconds."""
    rng = random.Random(plan.seed)  # noqa: S311 (a bench's draw)
    schedule = arrivals(plan, rng)
    bodies = [body(rng, plan.model)[0] for _ in range(min(len(schedule), 4096))]
    results: list[tuple[str, float, float, int]] = []
    url = f"{plan.gateway}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(part: str, who: int, payload: bytes) -> None:
            started, status = time.time(), 0
            headers = {
                "Authorization": f"Bearer {plan.secrets[who]}",
                "Content-Type": "application/json",
            }
            try:
                async with session.post(url, data=payload, headers=headers) as response:
                    async for _chunk in response.content.iter_any():
                        pass
                    status = response.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            results.append((part, started, time.time(), status))

        tasks = []
        began = time.perf_counter()
        for n, (offset, who, part) in enumerate(schedule):
            delay = began + offset - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(part, who, bodies[n % len(bodies)])))
        await asyncio.gather(*tasks)
    return results


def traffic_process(conn, plan: Plan) -> None:
    """multiprocessing target: send the plan, then the results down `conn`."""
    conn.send(asyncio.run(drive(plan)))
    conn.close()
