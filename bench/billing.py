"""bench/billing: a month of usage from 10 M usage events across 1,000
tenants, rated into finalized invoices by the invoice run.

    ./dev bench billing [--tenants 1000] [--events 10000000]

Setup (not timed): tenants (ten dedicated, ten with reservations, the rest
on shared pools), two models on six replicas, a price book with graduated
output tiers, a reservation fee and a dedicated book with a GPU-month fee;
a tenth of the tenants on a plan with a commitment and a discount, a tenth
with prepaid credit. The month's events are generated in PostgreSQL
(random arrival, 20-2,000 prompt tokens, a third of them partly cached,
1-400 completion tokens) and rolled up per hour, tenant, model and replica,
as the metering pipeline does (its own throughput is bench/ingest's).

Timed: the invoice run for the month, in a fresh process whose memory is
sampled (every tenant rated, late usage checked, drafted, credit applied,
numbered and finalized, one transaction per tenant); then the same run
again, which finds everything finalized. Beside it, in the same process:
the floor (the month's hourly rollups summed in one GROUP BY), what
the run reads now (the month's daily totals), and what keeping those
totals costs the rollups' writer (a day rebuilt with and without them).
Everything sits in January 2001 and is removed afterwards."""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

from django.db import connection, transaction  # noqa: E402
from django.db.models import Count  # noqa: E402

from bench.common import PeakRss, bench_database, database_settle, fleet_remove, report_write  # noqa: E402
from billing.models import (  # noqa: E402
    CreditGrant,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    ModelPrice,
    Plan,
    PriceBook,
    Subscription,
    VolumeTier,
)
from metering.days import usage_days_check  # noqa: E402
from metering.models import UsageRollup  # noqa: E402
from metering.selectors.rating import rated_sums, usage_by_stretch  # noqa: E402
from serving.models import Gpu, GpuSku, Node, Pool, Replica, Reservation, ServedModel  # noqa: E402
from tenants.models import Tenant, TenantPolicy  # noqa: E402

EPOCH = datetime(2001, 1, 1, tzinfo=UTC)
MONTH_END = datetime(2001, 2, 1, tzinfo=UTC)
FEB_END = datetime(2001, 3, 1, tzinfo=UTC)
LATE_TENANTS = 100  # tenants whose January grows after it was invoiced
PREFIX = "bench-bill-"
SPECIAL = 10  # dedicated tenants, then as many with reservations


def say(message: str) -> None:
    print(message, flush=True)


def world_build(*, tenants: int) -> dict:
    Tenant.objects.bulk_create(
        Tenant(name=f"Bench billing {n}", slug=f"{PREFIX}{n}", tier=_tier(n))
        for n in range(tenants)
    )
    people = list(Tenant.objects.filter(slug__startswith=PREFIX).order_by("pk"))
    TenantPolicy.objects.bulk_create(TenantPolicy(tenant=t) for t in people)
    models = [ServedModel.objects.create(name=f"{PREFIX}model-{m}") for m in range(2)]
    sku = GpuSku.objects.create(name=f"{PREFIX}H100", power_idle_watts=90, power_busy_watts=700)
    node = Node.objects.create(name=f"{PREFIX}node", site="bench")
    shared = Pool.objects.create(name=f"{PREFIX}shared", kind="shared")

    def replica(name, pool, model) -> Replica:
        r = Replica.objects.create(
            name=f"{PREFIX}{name}", base_url=f"http://127.0.0.1/{name}", model=model, pool=pool
        )
        gpu = Gpu.objects.create(
            serial=f"{PREFIX}{name}",
            sku=sku,
            node=node,
            in_service_date=date(2000, 6, 1),
            capex=Decimal("30000"),
            useful_life_months=48,
        )
        r.gpus.set([gpu])
        return r

    shared_replicas = [replica(f"s{k}", shared, models[k % 2]) for k in range(6)]
    special = []
    for k in range(SPECIAL):
        pool = Pool.objects.create(name=f"{PREFIX}ded-{k}", kind="dedicated", owner=people[k])
        special.append(replica(f"d{k}", pool, models[k % 2]))
    for k in range(SPECIAL):
        owner = people[SPECIAL + k]
        pool = Pool.objects.create(name=f"{PREFIX}res-{k}", kind="reserved", owner=owner)
        special.append(replica(f"r{k}", pool, models[k % 2]))
        Reservation.objects.create(
            tenant=owner, pool=pool, gpu_count=1, start=EPOCH - timedelta(days=5), end=MONTH_END
        )
    for tier, extra in (("", {"reservation_per_gpu_hour": Decimal("1.10")}),):
        book = PriceBook.objects.create(
            name=f"{PREFIX}list", tier=tier, effective_from=EPOCH, **extra
        )
        _prices(book, models)
    dedicated = PriceBook.objects.create(
        name=f"{PREFIX}dedicated",
        tier="dedicated",
        effective_from=EPOCH,
        dedicated_per_gpu_month=Decimal("1800"),
    )
    _prices(dedicated, models)
    plan = Plan.objects.create(
        name=f"{PREFIX}growth", minimum_commit=Decimal("500"), discount_percent=Decimal("5")
    )
    Subscription.objects.bulk_create(
        Subscription(tenant=t, plan=plan, start=EPOCH - timedelta(days=40))
        for t in people[2 * SPECIAL :: 10]
    )
    CreditGrant.objects.bulk_create(
        CreditGrant(tenant=t, amount=Decimal("25"), granted_at=EPOCH, note=PREFIX)
        for t in people[2 * SPECIAL + 5 :: 10]
    )
    return {"tenants": people, "shared": shared_replicas, "special": special}


def _tier(n: int) -> str:
    return "dedicated" if n < SPECIAL else "reserved" if n < 2 * SPECIAL else "shared"


def _prices(book: PriceBook, models) -> None:
    for m, model in enumerate(models):
        price = ModelPrice.objects.create(
            book=book,
            served_model=model,
            input_per_mtok=Decimal("0.15") * (m + 1),
            cached_input_per_mtok=Decimal("0.075") * (m + 1),
            output_per_mtok=Decimal("0.60") * (m + 1),
            per_gpu_second=Decimal("0.0001") if m else None,
        )
        VolumeTier.objects.bulk_create(
            VolumeTier(model_price=price, kind="output", from_tokens=start, per_mtok=per)
            for start, per in (
                (0, Decimal("0.60") * (m + 1)),
                (5_000_000, Decimal("0.45") * (m + 1)),
                (50_000_000, Decimal("0.30") * (m + 1)),
            )
        )


def usage_generate(world: dict, *, events: int, start: datetime = EPOCH, days: int = 31) -> int:
    """`events` usage events over `days` from `start`, generated and rolled
    up in SQL."""
    tenant_ids = [t.pk for t in world["tenants"]]
    shared = [(r.pk, r.pool_id, r.model_id) for r in world["shared"]]
    special = [(r.pk, r.pool_id, r.model_id) for r in world["special"]]
    sql = """
    INSERT INTO metering_usagerollup (hour, tenant_id, served_model_id, pool_id, replica_id,
        priority, prompt_tokens, cached_tokens, completion_tokens, requests_ok,
        requests_aborted, requests_error, requests_rejected, device_seconds, synthetic)
    SELECT date_trunc('hour', at), tenant_id, model_id, pool_id, replica_id, 0,
           sum(prompt), sum(cached), sum(completion), count(*), 0, 0, 0, sum(seconds), true
    FROM (
        SELECT %(epoch)s::timestamptz + random() * %(days)s * interval '1 day' AS at,
               (%(tenants)s::bigint[])[t + 1] AS tenant_id,
               CASE WHEN t < %(special)s THEN (%(sp_replica)s::bigint[])[t + 1]
                    ELSE (%(sh_replica)s::bigint[])[s + 1] END AS replica_id,
               CASE WHEN t < %(special)s THEN (%(sp_pool)s::bigint[])[t + 1]
                    ELSE (%(sh_pool)s::bigint[])[s + 1] END AS pool_id,
               CASE WHEN t < %(special)s THEN (%(sp_model)s::bigint[])[t + 1]
                    ELSE (%(sh_model)s::bigint[])[s + 1] END AS model_id,
               prompt, CASE WHEN random() < 0.33 THEN prompt / 2 ELSE 0 END AS cached,
               completion, completion * 0.004 AS seconds
        FROM (
            SELECT floor(random() * %(n_tenants)s)::int AS t,
                   floor(random() * %(n_shared)s)::int AS s,
                   20 + floor(random() * 1981)::bigint AS prompt,
                   1 + floor(random() * 400)::bigint AS completion
            FROM generate_series(1, %(events)s)
        ) draws
    ) generated
    GROUP BY 1, 2, 3, 4, 5
    """
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.42)")
        cursor.execute(
            sql,
            {
                "epoch": start,
                "days": days,
                "tenants": tenant_ids,
                "special": 2 * SPECIAL,
                "sp_replica": [r[0] for r in special],
                "sp_pool": [r[1] for r in special],
                "sp_model": [r[2] for r in special],
                "sh_replica": [r[0] for r in shared],
                "sh_pool": [r[1] for r in shared],
                "sh_model": [r[2] for r in shared],
                "n_tenants": len(tenant_ids),
                "n_shared": len(shared),
                "events": events,
            },
        )
        rows = cursor.rowcount
    database_settle("metering_usagerollup", "metering_usageday")
    return rows


def _invoice(queue) -> None:
    """In a fresh (spawned) process, so its peak memory is the run's own."""
    django.setup()
    from billing.invoicing.runs import invoice_run_create, invoice_run_execute

    as_of = MONTH_END + timedelta(hours=2)
    floor, read, check = _aggregate_floor(), _read_floor(), _days_check_cost()
    profiler = None
    if os.environ.get("BENCH_PROFILE"):
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    with PeakRss() as rss:
        started = time.perf_counter()
        run = invoice_run_execute(run_id=invoice_run_create(as_of=as_of).pk)
        if profiler:
            profiler.disable()
            profiler.dump_stats(os.environ["BENCH_PROFILE"])
        first = (time.perf_counter() - started, rss.take(), run.status, run.tenants_total)
        started = time.perf_counter()
        again = invoice_run_execute(run_id=invoice_run_create(as_of=as_of).pk)
        second = (time.perf_counter() - started, rss.take(), again.status, again.invoices_skipped)
        _january_grows()  # late usage for the invoiced month (not timed)
        started = time.perf_counter()
        february = invoice_run_execute(run_id=invoice_run_create(as_of=FEB_END).pk)
        third = (time.perf_counter() - started, rss.take(), february.status, _late_lines())
    queue.put((first, second, third, (floor, read, check, *_day_rebuild_cost())))


def _best_of_three(fn) -> float:
    """The best of three timings of `fn`, after a warm-up."""

    def once() -> float:
        started = time.perf_counter()
        fn()
        return time.perf_counter() - started

    once()
    return min(once() for _ in range(3))


def _aggregate_floor() -> float:
    """The floor: the month's hourly rollups summed per tenant and
    model in one GROUP BY (what the run read before the daily totals)."""
    hours = (
        UsageRollup.objects.filter(hour__gte=EPOCH, hour__lt=MONTH_END, served_model__isnull=False)
        .values_list("tenant_id", "served_model_id")
        .annotate(**rated_sums(rows=Count("pk")))
        .order_by("tenant_id", "served_model_id")
    )
    return _best_of_three(lambda: list(hours.all()))  # .all(): a fresh query each time


def _read_floor() -> float:
    """What the run reads of the month's usage now, alone: its whole days'
    totals (metering.selectors.rating.usage_by_stretch, every tenant, one stretch)."""
    return _best_of_three(
        lambda: usage_by_stretch(start=EPOCH, end=MONTH_END, edges=[EPOCH], tenant_ids=None)
    )


def _days_check_cost() -> float:
    """The nightly check of the month's daily totals against their hours
    (metering.days.usage_days_check): the floor's aggregate joined to the
    days. None may differ."""
    drifted = usage_days_check(start=EPOCH, end=MONTH_END)
    assert not drifted, drifted[:5]
    return _best_of_three(lambda: usage_days_check(start=EPOCH, end=MONTH_END))


def _day_rebuild_cost() -> tuple[float, float, int]:
    """What keeping the daily totals costs the rollups' writer: a day's
    hourly rows rebuilt (deleted and inserted again in one statement, as
    the rollup job rebuilds an hour), with the daily totals kept by their
    triggers and with those triggers disabled, each rolled back (before
    the foreign keys' deferred checks, which run in neither). Three days each, taking turns, a day
    never rebuilt twice (a rolled-back rebuild leaves its dead rows in the
    indexes); the best of each. Seconds with, without, rows a day."""

    def rebuild(day: datetime, *, kept: bool) -> tuple[float, int]:
        with transaction.atomic(), connection.cursor() as cursor:
            if not kept:
                for op in ("insert", "update", "delete"):
                    cursor.execute(
                        f"ALTER TABLE metering_usagerollup DISABLE TRIGGER usageday_{op}"
                    )
            started = time.perf_counter()
            cursor.execute(
                "WITH gone AS (DELETE FROM metering_usagerollup WHERE hour >= %s AND hour < %s "
                "RETURNING *) INSERT INTO metering_usagerollup SELECT * FROM gone",
                [day, day + timedelta(days=1)],
            )
            took, rows = time.perf_counter() - started, cursor.rowcount
            transaction.set_rollback(True)
        return took, rows

    kept, bare, rows = [], [], 0
    for n in range(3):
        took, rows = rebuild(EPOCH + timedelta(days=10 + 2 * n), kept=True)
        kept.append(took)
        bare.append(rebuild(EPOCH + timedelta(days=11 + 2 * n), kept=False)[0])
    return min(kept), min(bare), rows


def _january_grows() -> None:
    """Late records for the last hour of January, for some tenants: their
    rollups are rebuilt larger after January was invoiced."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE metering_usagerollup SET completion_tokens = completion_tokens + 100000 "
            "WHERE hour >= %s AND hour < %s AND tenant_id IN (SELECT id FROM tenants_tenant "
            "WHERE slug LIKE %s ORDER BY id OFFSET %s LIMIT %s)",
            [MONTH_END - timedelta(hours=1), MONTH_END, f"{PREFIX}%", 2 * SPECIAL, LATE_TENANTS],
        )


def _late_lines() -> int:
    return InvoiceLine.objects.filter(
        late=True, invoice__tenant__slug__startswith=PREFIX, invoice__period_start=MONTH_END
    ).count()


def _rollup_rows(start: datetime, end: datetime) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM metering_usagerollup WHERE hour >= %s AND hour < %s",
            [start, end],
        )
        return cursor.fetchone()[0]


def invoices_remove() -> None:
    """Remove the benchmark's invoices, finalized ones included: the
    immutability triggers are bypassed for this session only (a superuser's
    session_replication_role), which production code never does."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            "DELETE FROM billing_invoiceline WHERE invoice_id IN (SELECT i.id FROM "
            "billing_invoice i JOIN tenants_tenant t ON t.id = i.tenant_id "
            "WHERE t.slug LIKE %s)",
            [f"{PREFIX}%"],
        )
        cursor.execute(
            "DELETE FROM billing_creditapplication WHERE grant_id IN "
            "(SELECT id FROM billing_creditgrant WHERE note = %s)",
            [PREFIX],
        )
        cursor.execute(
            "DELETE FROM billing_invoice WHERE tenant_id IN "
            "(SELECT id FROM tenants_tenant WHERE slug LIKE %s)",
            [f"{PREFIX}%"],
        )
    InvoiceRun.objects.filter(as_of__lt=MONTH_END + timedelta(days=1)).delete()


def cleanup() -> None:
    invoices_remove()
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM metering_usagerollup WHERE hour < %s", [FEB_END])
    CreditGrant.objects.filter(note=PREFIX).delete()
    Subscription.objects.filter(tenant__slug__startswith=PREFIX).delete()
    Plan.objects.filter(name__startswith=PREFIX).delete()
    PriceBook.objects.filter(name__startswith=PREFIX).delete()
    fleet_remove(PREFIX)
    TenantPolicy.objects.filter(tenant__slug__startswith=PREFIX).delete()
    Tenant.objects.filter(slug__startswith=PREFIX).delete()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--keep", action="store_true", help="leave the data (to study it)")
    parser.add_argument("--reuse", action="store_true", help="invoice data left by --keep")
    args = parser.parse_args()

    bench_database("bench_billing")  # a database of its own, migrated
    if args.reuse:
        invoices_remove()
        rollups = _rollup_rows(EPOCH, MONTH_END)
        february = _rollup_rows(MONTH_END, FEB_END)
        setup = 0.0
    else:
        cleanup()
        say(f"building {args.tenants:,} tenants, a fleet and prices ...")
        with transaction.atomic():
            world = world_build(tenants=args.tenants)
        say(f"generating and rolling up {args.events:,} usage events (a few minutes) ...")
        started = time.perf_counter()
        rollups = usage_generate(world, events=args.events)
        february = usage_generate(world, events=args.events // 10, start=MONTH_END, days=28)
        setup = time.perf_counter() - started
    say(f"  {rollups:,} rollup rows in {setup:.0f} s; invoicing ...")

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    connection.close()
    child = ctx.Process(target=_invoice, args=(queue,))
    child.start()
    first, second, third, floors = queue.get(timeout=1800)
    floor, read, check, rebuild, rebuild_bare, day_rows = floors
    (seconds, rss, status, tenants), (again, again_rss, again_status, skipped) = first, second
    next_seconds, next_rss, next_status, late_lines = third
    child.join()
    january = Invoice.objects.filter(tenant__slug__startswith=PREFIX, period_start=EPOCH)
    invoices = january.count()
    lines = InvoiceLine.objects.filter(invoice__in=january).count()
    if not args.keep:
        cleanup()

    body = "\n".join(
        [
            "| step | tenants | invoices | seconds | tenants/s | peak RSS MiB |",
            "|---|---|---|---|---|---|",
            f"| invoice run: rate, draft, apply credit, number, finalize | {tenants:,} "
            f"| {invoices:,} | {seconds:.2f} | {tenants / seconds:,.0f} | {rss:.0f} |",
            f"| the same run again (everything already finalized) | {tenants:,} "
            f"| {skipped:,} skipped | {again:.2f} | {tenants / again:,.0f} "
            f"| {again_rss:.0f} |",
            f"| next month's run: February ({args.events // 10:,} events), January checked "
            f"for late usage ({LATE_TENANTS} tenants have some: {late_lines} late lines) "
            f"| {tenants:,} | {args.tenants:,} | {next_seconds:.2f} "
            f"| {tenants / next_seconds:,.0f} | {next_rss:.0f} |",
            f"| floor: the month's hourly rollups summed per tenant and model (one GROUP BY) "
            f"| {tenants:,} | | {floor:.2f} | | |",
            f"| what the run reads of the usage now: the month's daily totals "
            f"(metering.selectors.rating.usage_by_stretch) | {tenants:,} | | {read:.3f} | | |",
            f"| the nightly check of the month's daily totals against their hours "
            f"(metering.days.usage_days_check; none differ) | {tenants:,} | | {check:.2f} | | |",
            f"| cost on the rollups' writer: a day's hourly rows rebuilt ({day_rows:,} rows), "
            f"daily totals kept by the triggers | | | {rebuild:.3f} | | |",
            f"| the same with the daily totals' triggers disabled | | | {rebuild_bare:.3f} | | |",
            "",
            f"The target: the invoice run {seconds:.2f} s against its floor "
            f"{floor:.2f} s: x {seconds / floor:.2f} (target ≤ 1.5 s and ≤ x 1.4: "
            f"{'met' if seconds <= 1.5 and seconds <= 1.4 * floor else 'not met'}). "
            f"The run reads its usage from the daily totals in {read:.3f} s, so what is "
            f"left is its own work: {seconds - read:.2f} s. Keeping the totals costs the "
            f"rollups' writer x {rebuild / rebuild_bare:.2f} per day rebuilt.",
        ]
    ) + (
        f"\n\nRun status: {status} / {again_status} / {next_status}. "
        f"In: {args.events:,} usage events of "
        f"January 2001 ({rollups:,} hourly rollup rows; February {february:,}; generated and "
        f"rolled up in SQL in {setup:.0f} s, not timed); out: {invoices:,} finalized January "
        f"invoices of the benchmark's tenants with {lines:,} "
        "lines (graduated tiers, cached input, GPU-seconds, reservation and dedicated fees, "
        "discounts, commitment true-ups, prepaid credit). "
        f"PostgreSQL: {'DATABASE_URL' if os.environ.get('DATABASE_URL') else 'embedded'}. "
        "The run takes every tenant in the database (the benchmark's and any others). "
        "Peak RSS: sampled in a fresh process that runs only the job. "
        "The original target: 10 M events across 1,000 tenants into invoices in at most 10 s."
    )
    report_write(
        name="billing",
        title="Invoicing (bench/billing.py)",
        command="./dev bench billing",
        body=body,
    )


if __name__ == "__main__":
    main()
