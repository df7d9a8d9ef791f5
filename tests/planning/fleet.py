"""A costed fleet for planning's tests (tests.billing.conftest's world):
a shared pool with one replica on one leased GPU, five weeks of hourly
demand for it, and the replica's load hours with a known latency curve."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from metering.models import ReplicaLoadHour, UsageRollup
from serving.models import Pool, Replica
from tests.billing.conftest import World

NOW = datetime(2026, 11, 20, 9, 30, tzinfo=UTC)
HOUR0 = NOW.replace(minute=0)
# TTFT p95 = 100 ms + 5 ms per thousand tokens an hour: 2,000 ms (the
# shared default's target) at 380,000 tokens an hour.
KNEE = 380_000


def ttft_at(tokens: float) -> float:
    return 100 + 0.005 * tokens


def shared_fleet(world: World) -> tuple[Pool, Replica]:
    pool = world.pool("shared")
    gpu = world.gpu("leased-1", lease_rate_per_hour=Decimal("2.00"))
    replica = world.replica("r1", pool, [gpu])
    world.rate("energy", "0.10", "per_kwh")
    world.rate("pue", "1.5", "ratio")
    return pool, replica


def demand_write(
    world: World, replica: Replica, *, weeks: int, tokens: Callable[[int], int], seconds_per_token
):
    """`weeks` of hours before NOW's hour on `replica`, Alpha's: 70%
    prompt (a seventh of it cached), 30% completion; device time at
    `seconds_per_token`. `tokens(h)`: the tokens of hour h (0 the first)."""
    first = HOUR0 - timedelta(weeks=weeks)
    rows = []
    for h in range(weeks * 168):
        total = tokens(h)
        prompt, completion = total * 7 // 10, total * 3 // 10
        rows.append(
            UsageRollup(
                hour=first + timedelta(hours=h),
                tenant=world.a,
                served_model=world.model,
                pool=replica.pool,
                replica=replica,
                prompt_tokens=prompt,
                cached_tokens=prompt // 7,
                completion_tokens=completion,
                requests_ok=max(1, total // 1000),
                device_seconds=Decimal(str(total * seconds_per_token)),
            )
        )
    UsageRollup.objects.bulk_create(rows)


def load_write(replica: Replica, *, days: int = 21) -> None:
    """`days` of hours before NOW's: loads from 10,000 to 600,000 tokens
    an hour in turn, TTFT p95 on the curve above, inter-token p95 30 ms."""
    first = HOUR0 - timedelta(days=days)
    rows = []
    for h in range(days * 24):
        tokens = 10_000 + (h * 7919) % 590_000
        rows.append(
            ReplicaLoadHour(
                hour=first + timedelta(hours=h),
                replica=replica,
                served_model=replica.model,
                pool=replica.pool,
                requests=max(20, tokens // 1000),
                tokens=tokens,
                busy_seconds=Decimal(tokens) / 100,
                ttft_p95_ms=Decimal(str(round(ttft_at(tokens), 3))),
                itl_p95_ms=Decimal(30),
            )
        )
    ReplicaLoadHour.objects.bulk_create(rows)
