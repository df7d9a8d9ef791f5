"""bench/allocation: one month of cost allocation for 1,000 GPUs x 720 hours.

    ./dev bench allocation [--gpus 1000] [--days 30]

A synthetic fleet (8-GPU nodes, 4-GPU replicas; shared pools under both idle
policies, reserved pools with reservations, dedicated pools; owned GPUs of
several ages, some past their life, some leased), 100 tenants and 5 models,
and a month of hourly usage rollups shaped like a day: busier by day than by
night, a few tenants per replica-hour. Rates: a peak / off-peak energy
tariff, a PUE, colocation per kW-month, network per GPU-month and staff per
GPU-hour. The job then allocates the month end to end (read and aggregate
in SQL, compute vectorised, write day by day) in a fresh process whose
memory is sampled. Everything sits in January 2001 and is removed
afterwards. Prints a table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import io
import multiprocessing
import os
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import numpy as np  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.common import PeakRss, database_settle, fleet_remove, report_write  # noqa: E402
from billing.costs.rates import cost_rate_create  # noqa: E402
from billing.models import AllocationRun, CostAllocation, CostRate, PoolHourCost  # noqa: E402
from serving.models import Gpu, GpuSku, Node, Pool, Replica, Reservation, ServedModel  # noqa: E402
from tenants.models import Tenant  # noqa: E402
from tenants.services import tenant_create  # noqa: E402

EPOCH = datetime(2001, 1, 1, tzinfo=UTC)
PREFIX = "bench-alloc-"
TENANTS = 100
MODELS = 5
GPUS_PER_REPLICA = 4


def say(message: str) -> None:
    print(message, flush=True)


def fleet_build(*, gpus: int, rng: np.random.Generator) -> list[Replica]:
    tenants = [
        Tenant.objects.filter(slug=f"{PREFIX}{n}").first()
        or tenant_create(name=f"Bench tenant {n}", slug=f"{PREFIX}{n}")
        for n in range(TENANTS)
    ]
    models = [ServedModel.objects.create(name=f"{PREFIX}model-{m}") for m in range(MODELS)]
    skus = [
        GpuSku.objects.create(name=f"{PREFIX}H100", power_idle_watts=90, power_busy_watts=700),
        GpuSku.objects.create(name=f"{PREFIX}L40S", power_idle_watts=40, power_busy_watts=350),
    ]
    n_replicas = gpus // GPUS_PER_REPLICA
    # A fifth of replicas in dedicated pools, a fifth reserved, the rest shared.
    pools = [
        Pool.objects.create(name=f"{PREFIX}shared-spread", kind="shared"),
        Pool.objects.create(
            name=f"{PREFIX}shared-platform", kind="shared", idle_cost_policy="platform"
        ),
    ]
    for k in range(10):
        pools.append(
            Pool.objects.create(name=f"{PREFIX}dedicated-{k}", kind="dedicated", owner=tenants[k])
        )
        pools.append(
            Pool.objects.create(
                name=f"{PREFIX}reserved-{k}", kind="reserved", owner=tenants[10 + k]
            )
        )
    nodes = [Node.objects.create(name=f"{PREFIX}node-{n}", site="bench") for n in range(gpus // 8)]
    gpu_rows = []
    for g in range(gpus):
        age_months = int(rng.integers(0, 60))
        in_service = date(2000, 12, 1) - timedelta(days=30 * age_months)
        leased = g % 10 == 9
        gpu_rows.append(
            Gpu(
                serial=f"{PREFIX}{g}",
                sku=skus[g % 3 == 0],
                node=nodes[g // 8],
                in_service_date=in_service,
                capex=None if leased else Decimal("30000"),
                useful_life_months=None if leased else 48,
                salvage_value=Decimal(0) if leased else Decimal("3000"),
                lease_rate_per_hour=Decimal("2.10") if leased else None,
            )
        )
    Gpu.objects.bulk_create(gpu_rows)
    gpu_objects = list(Gpu.objects.filter(serial__startswith=PREFIX).order_by("pk"))
    replicas = []
    for r in range(n_replicas):
        if r < n_replicas // 5:
            pool = pools[2 + 2 * (r % 10)]  # dedicated
        elif r < 2 * n_replicas // 5:
            pool = pools[3 + 2 * (r % 10)]  # reserved
        else:
            pool = pools[r % 2]
        replica = Replica.objects.create(
            name=f"{PREFIX}r{r}",
            base_url=f"http://127.0.0.1/{r}",
            model=models[r % MODELS],
            pool=pool,
        )
        replica.gpus.set(gpu_objects[r * GPUS_PER_REPLICA : (r + 1) * GPUS_PER_REPLICA])
        replicas.append(replica)
    for k in range(10):
        pool = pools[3 + 2 * k]
        held = sum(GPUS_PER_REPLICA for r in replicas if r.pool_id == pool.pk)
        Reservation.objects.create(
            tenant=tenants[10 + k],
            pool=pool,
            gpu_count=max(1, held * 3 // 4),
            start=EPOCH - timedelta(days=10),
            end=EPOCH + timedelta(days=400),
        )
    return replicas


def rates_book(days: int) -> None:
    span = {"effective_from": EPOCH, "effective_to": EPOCH + timedelta(days=days)}
    for hours, price in (((0, 8), "0.08"), ((8, 20), "0.16"), ((20, 24), "0.08")):
        cost_rate_create(
            component="energy",
            basis="per_kwh",
            amount=Decimal(price),
            hour_from=hours[0],
            hour_to=hours[1],
            note=PREFIX,
            **span,
        )
    cost_rate_create(component="pue", basis="ratio", amount=Decimal("1.35"), note=PREFIX, **span)
    cost_rate_create(
        component="colocation", basis="per_kw_month", amount=Decimal("180"), note=PREFIX, **span
    )
    cost_rate_create(
        component="network", basis="per_gpu_month", amount=Decimal("45"), note=PREFIX, **span
    )
    cost_rate_create(
        component="staff", basis="per_gpu_hour", amount=Decimal("0.12"), note=PREFIX, **span
    )


def rollups_write(replicas: list[Replica], *, days: int, rng: np.random.Generator) -> int:
    """Hourly rollups: per replica-hour, 1-6 tenants sharing a busy fraction
    that follows the day; dedicated and reserved replicas serve their owner."""
    tenants = list(Tenant.objects.filter(slug__startswith=PREFIX).order_by("slug"))
    pools = {p.pk: p for p in Pool.objects.filter(name__startswith=PREFIX)}
    buffer = io.StringIO()
    rows = 0
    hours = days * 24
    daily = 0.35 + 0.45 * np.sin(np.pi * ((np.arange(hours) % 24) - 6) / 24).clip(0)
    for replica in replicas:
        pool = pools[replica.pool_id]
        capacity = GPUS_PER_REPLICA * 3600
        busy = (daily * rng.uniform(0.6, 1.1, hours)).clip(0.02, 0.98) * capacity
        for h in range(hours):
            if pool.kind == "shared":
                who = rng.choice(len(tenants), size=int(rng.integers(1, 7)), replace=False)
            else:
                who = [tenants.index(next(t for t in tenants if t.pk == pool.owner_id))]
            split = rng.dirichlet(np.ones(len(who))) * busy[h]
            hour = (EPOCH + timedelta(hours=h)).isoformat()
            for t, seconds in zip(who, split, strict=True):
                tokens = int(seconds * 900)
                buffer.write(
                    f"{hour}\t{tenants[t].pk}\t{replica.model_id}\t{pool.pk}\t{replica.pk}\t0\t"
                    f"{tokens * 3}\t{tokens}\t{tokens}\t{int(seconds)}\t0\t0\t0\t{seconds:.6f}\tt\n"
                )
                rows += 1
    buffer.seek(0)
    columns = (
        "hour, tenant_id, served_model_id, pool_id, replica_id, priority, prompt_tokens, "
        "cached_tokens, completion_tokens, requests_ok, requests_aborted, requests_error, "
        "requests_rejected, device_seconds, synthetic"
    )
    with (
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY metering_usagerollup ({columns}) FROM STDIN") as copy,
    ):
        while chunk := buffer.read(1 << 20):
            copy.write(chunk)
    return rows


def _allocate(queue, days: int) -> None:
    """In a fresh (spawned) process, so its peak memory is allocation's own."""
    django.setup()
    from billing.costs.period import allocation_compute
    from billing.costs.runs import allocation_run_create, allocation_run_execute

    end = EPOCH + timedelta(days=days)
    with PeakRss() as rss:
        started = time.perf_counter()
        run = allocation_run_create(start=EPOCH, end=end)
        run = allocation_run_execute(run_id=run.pk)
        total = time.perf_counter() - started
        run_rss = rss.take()
        # The compute alone, again (reads + vectorised maths, no writes).
        started = time.perf_counter()
        result = allocation_compute(start=EPOCH, end=end)
        compute = time.perf_counter() - started
        compute_rss = rss.take()
    queue.put(
        (
            total,
            compute,
            run.status,
            len(result.pool_hours),
            len(result.rows),
            run_rss,
            compute_rss,
        )
    )


def cleanup() -> None:
    end = EPOCH + timedelta(days=60)
    PoolHourCost.objects.filter(hour__lt=end).delete()
    CostAllocation.objects.filter(hour__lt=end).delete()
    AllocationRun.objects.filter(start__lt=end).delete()
    CostRate.objects.filter(note=PREFIX).delete()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour < %s", [end])
    fleet_remove(PREFIX)


def settle() -> None:
    """Start the timed part from a settled database (bench.common.database_settle)."""
    tables = ("metering_usagerollup", "billing_costallocation", "billing_poolhourcost")
    if not database_settle(*tables):
        say("  (no CHECKPOINT: not a superuser)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--days", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(11)

    cleanup()
    say(f"building a fleet of {args.gpus:,} GPUs and {args.days} days of rollups ...")
    with transaction.atomic():
        replicas = fleet_build(gpus=args.gpus, rng=rng)
        rates_book(args.days)
    rollups = rollups_write(replicas, days=args.days, rng=rng)
    settle()
    say(f"  {rollups:,} rollup rows; allocating ...")

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    connection.close()
    child = ctx.Process(target=_allocate, args=(queue, args.days))
    child.start()
    total, compute, status, pool_hours, rows, rss, compute_rss = queue.get(timeout=900)
    child.join()
    cleanup()

    hours = args.days * 24
    body = "\n".join(
        [
            "| step | GPU-hours | seconds | peak RSS MiB |",
            "|---|---|---|---|",
            f"| allocation run, end to end (read, compute, write {hours // 24} days) "
            f"| {args.gpus * hours:,} | {total:.2f} | {rss:.0f} |",
            f"| read + compute of the whole month at once, no writes | {args.gpus * hours:,} "
            f"| {compute:.2f} | {compute_rss:.0f} |",
            "",
            f"The target: end to end {total:.2f} s, x {total / compute:.2f} of its floor "
            f"(the read and compute alone, {compute:.2f} s, in the same run); target ≤ 2 s "
            f"({'met' if total <= 2 else 'not met'}).",
        ]
    ) + (
        f"\n\nRun status: {status}. {args.gpus:,} GPUs in {len(replicas)} replicas, "
        f"{hours} hours, {rollups:,} usage rollup rows in; out: {pool_hours:,} pool-hour "
        f"rows and {rows:,} allocation rows (hour x tenant x pool x model). "
        f"PostgreSQL: {'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded'}. "
        "The run computes a week at a time in a worker thread while the main thread writes "
        "the previous week, a day per transaction. Peak RSS: sampled in a fresh process "
        "that runs only the job. "
        "The original target: one month for 1,000 GPUs x 720 hours in at most 5 s end to end."
    )
    report_write(
        name="allocation",
        title="Cost allocation (bench/allocation.py)",
        command="./dev bench allocation",
        body=body,
    )


if __name__ == "__main__":
    main()
