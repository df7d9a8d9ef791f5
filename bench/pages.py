"""bench/pages: the dashboard's pages with a year of hourly rollups for
1,000 tenants, served by the product's web server (uvicorn), timed from a
client on loopback.

    ./dev bench pages [--tenants 1000] [--days 365] [--requests 40] [--keep]

Setup (not timed, in a database of its own on the same server, dropped
afterwards unless --keep; --reuse takes a kept one): the tenants, ten pools
(shared, reserved, dedicated) of eight GPUs, one hourly rollup row per
tenant per hour for the whole period (8.76 M rows for the defaults, made in
PostgreSQL), the last 30 days of GPU cost allocated, the month-to-date
margin report built (as the nightly job does), and each tenant's last
invoice finalized.

Timed: `--requests` sequential GETs per page after five warm-up ones, as
finance staff and as a tenant's owner, each page's p50 / p95 / max, and
/healthz (the server's floor) for the ratio; beside them, the same app in a
second server whose worker's startup heap is not frozen (core.heap), the
two taking turns request by request, and each worker's collector pauses.
Target: p95 under 300 ms on every page."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import logging  # noqa: E402

import httpx  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, connections, transaction  # noqa: E402
from tqdm import tqdm  # noqa: E402

from bench.common import (  # noqa: E402
    collector_read,
    collector_table,
    database_switch,
    databases_drop,
    report_write,
)
from core.processes import (  # noqa: E402
    ManagedProcess,
    free_port,
    uvicorn_argv,
)

PASSWORD = "bench-pages-password"  # noqa: S105 (a throwaway database)
POOLS = [("dedicated", 3), ("reserved", 3), ("shared", 4)]  # owners: tenants 0-5, by tier
PAGES_FINANCE = [
    "/finance/",
    "/costs/",
    "/costs/?days=30",
    "/fleet/",
    "/invoices/",
    "/finance/tenants/bench-0/",
    "/finance/models/bench-llama-8b/",
    "/reconciliation/",
    "/reconciliation/?days=30",
]
PAGES_TENANT = [
    "/usage/",
    "/usage/?days=90",
    "/invoices/",
    "/keys/",
    "/api/v1/usage?group_by=day&start={month_ago}&end={now}",
]


logging.getLogger("httpx").setLevel(logging.WARNING)


COLLECTOR_TIMED_APP = "bench.collector_timed_asgi:application"


def say(message: str) -> None:
    print(message, flush=True)


def world_build(*, tenants: int, days: int, now: datetime) -> dict:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group

    from billing.models import ModelPrice, PriceBook
    from serving.models import Gpu, GpuSku, Node, Pool, Replica, ServedModel
    from tenants.choices import FINANCE_GROUP, Role
    from tenants.models import Membership, Tenant, TenantPolicy

    since = (now - timedelta(days=days + 31)).replace(day=1, hour=0, minute=0, second=0)
    with transaction.atomic():
        Tenant.objects.bulk_create(
            Tenant(name=f"Bench tenant {n}", slug=f"bench-{n}", tier=_tier(n))
            for n in range(tenants)
        )
        people = list(Tenant.objects.order_by("pk"))
        TenantPolicy.objects.bulk_create(
            TenantPolicy(tenant=t, monthly_budget=Decimal("5000")) for t in people
        )
        users = get_user_model()
        finance = users.objects.create_user("bench-finance", password=PASSWORD)
        finance.groups.add(Group.objects.get(name=FINANCE_GROUP))
        owner = users.objects.create_user("bench-owner", password=PASSWORD)
        Membership.objects.create(tenant=people[0], user=owner, role=Role.OWNER)
        model = ServedModel.objects.create(name="bench-llama-8b")
        # In the catalogue, priced by no book: /reconciliation/ must read the
        # rollups to find its (absent) usage, its worst case.
        ServedModel.objects.create(name="bench-unpriced")
        sku = GpuSku.objects.create(name="bench H100", power_idle_watts=90, power_busy_watts=700)
        node = Node.objects.create(name="bench-node", site="bench")
        replicas = []
        for kind, count in POOLS:
            for k in range(count):
                owner_tenant = people[len(replicas)] if kind != "shared" else None
                pool = Pool.objects.create(name=f"{kind}-{k}", kind=kind, owner=owner_tenant)
                replica = Replica.objects.create(
                    name=f"vllm-{kind}-{k}", base_url="http://127.0.0.1:9", model=model, pool=pool
                )
                replica.gpus.set(
                    Gpu.objects.create(
                        serial=f"{kind}-{k}-gpu{g}",
                        sku=sku,
                        node=node,
                        in_service_date=since.date(),
                        capex=Decimal("30000"),
                        useful_life_months=48,
                    )
                    for g in range(8)
                )
                replicas.append(replica)
        book = PriceBook.objects.create(name="bench list", effective_from=since)
        ModelPrice.objects.create(
            book=book,
            served_model=model,
            input_per_mtok=Decimal("0.20"),
            cached_input_per_mtok=Decimal("0.05"),
            output_per_mtok=Decimal("0.80"),
        )
    return {"tenants": people, "replicas": replicas, "model": model}


def _tier(n: int) -> str:
    return "dedicated" if n < 3 else "reserved" if n < 6 else "shared"


ROLLUPS = """
INSERT INTO metering_usagerollup (hour, tenant_id, served_model_id, pool_id, replica_id,
    priority, prompt_tokens, cached_tokens, completion_tokens, requests_ok, requests_aborted,
    requests_error, requests_rejected, device_seconds, synthetic)
SELECT h, t.id, %(model)s, (%(pools)s::bigint[])[r + 1], (%(replicas)s::bigint[])[r + 1], 0,
       p, p / 4, c, 1 + (p + c) / 1500, 0, 0, 0, round(c * 0.002, 6), true
FROM generate_series(%(start)s::timestamptz, %(end)s::timestamptz - interval '1 hour',
                     interval '1 hour') AS h
CROSS JOIN LATERAL (
    SELECT id, CASE WHEN rank <= %(owned)s THEN rank - 1
                    ELSE %(owned)s + rank %% %(shared)s END AS r
    FROM (SELECT id, row_number() OVER (ORDER BY id) AS rank FROM tenants_tenant) ranked
) t
CROSS JOIN LATERAL (
    SELECT (20000 + random() * 180000)::bigint AS p, (5000 + random() * 45000)::bigint AS c
) draw
"""


def rollups_generate(world: dict, *, start: datetime, end: datetime) -> int:
    """One row per tenant per hour, a month at a time (a progress bar)."""
    replicas = world["replicas"]
    owned = sum(count for kind, count in POOLS if kind != "shared")
    shared = [r for r in replicas if r.pool.kind == "shared"]
    ordered = [r for r in replicas if r.pool.kind != "shared"] + shared
    params = {
        "model": world["model"].pk,
        "pools": [r.pool_id for r in ordered],
        "replicas": [r.pk for r in ordered],
        "owned": owned,
        "shared": len(shared),
    }
    rows = 0
    chunks = []
    moment = start
    while moment < end:
        stop = min(end, moment + timedelta(days=30))
        chunks.append((moment, stop))
        moment = stop
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.7)")
        cursor.execute("SET synchronous_commit TO OFF")
        for chunk_start, chunk_end in tqdm(chunks, desc="rollups (30-day chunks)"):
            cursor.execute(ROLLUPS, {**params, "start": chunk_start, "end": chunk_end})
            rows += cursor.rowcount
        cursor.execute("VACUUM ANALYZE metering_usagerollup")
    return rows


def derived_build(*, now: datetime) -> dict:
    """What the nightly jobs leave: 30 days allocated, the month-to-date
    margin report, last month's invoices finalized."""
    from billing.choices import ReportKind
    from billing.costs.runs import allocation_run_create, allocation_run_execute
    from billing.invoicing.runs import invoice_run_create, invoice_run_execute
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from core.calendar import month_containing

    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    timings = {}
    started = time.perf_counter()
    with tqdm(desc="allocation, last 30 days", unit="h") as bar:

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.n)

        run = allocation_run_create(start=today - timedelta(days=30), end=today)
        allocation_run_execute(run_id=run.pk, progress=progress)
    timings["allocation"] = time.perf_counter() - started
    month_start, _ = month_containing(today)
    started = time.perf_counter()
    invoice_run_execute(run_id=invoice_run_create(as_of=month_start + timedelta(hours=2)).pk)
    timings["invoices"] = time.perf_counter() - started
    started = time.perf_counter()
    end = today if today > month_start else now.replace(minute=0, second=0, microsecond=0)
    report = margin_report_request(kind=ReportKind.MONTH_TO_DATE, start=month_start, end=end)
    margin_report_build(report_id=report.pk)
    timings["margin report"] = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    return timings


def signed_in(base: str, username: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=60, follow_redirects=False)
    page = client.get("/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    response = client.post(
        "/login/",
        data={"username": username, "password": PASSWORD, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/login/"},
    )
    if response.status_code != 302:
        raise SystemExit(f"could not sign in as {username}: {response.status_code}")
    return client


def timed(clients: list[httpx.Client], path: str, *, requests: int) -> list[dict]:
    """Each client's p50 / p95 / max over `requests` GETs of `path`, the
    clients taking turns request by request (the machine's noise falls on
    every arm alike)."""
    for client in clients:
        for _ in range(5):
            client.get(path)
    samples, size = [[] for _ in clients], 0
    for n in range(requests):
        for i in range(len(clients)) if n % 2 == 0 else reversed(range(len(clients))):
            started = time.perf_counter()
            response = clients[i].get(path)
            samples[i].append((time.perf_counter() - started) * 1000)
            if response.status_code != 200:
                raise SystemExit(f"{path}: HTTP {response.status_code}")
            size = len(response.content)
    return [
        {
            "p50": statistics.median(arm),
            "p95": arm[min(len(arm) - 1, round(0.95 * (len(arm) - 1)))],
            "max": arm[-1],
            "kib": size / 1024,
        }
        for arm in map(sorted, samples)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--keep", action="store_true", help="leave the database (to study it)")
    parser.add_argument("--reuse", action="store_true", help="time a database left by --keep")
    args = parser.parse_args()

    home = connections["default"].settings_dict["NAME"]
    name = f"{home}_bench_pages"
    now = datetime.now(UTC)
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(days=args.days)
    url = database_switch(name, create=not args.reuse)
    setup = {}
    if not args.reuse:
        say(f"database {name}: migrating ...")
        call_command("migrate", verbosity=0)
        say(f"{args.tenants:,} tenants, 10 pools of 8 GPUs, {args.days} days of rollups ...")
        world = world_build(tenants=args.tenants, days=args.days, now=now)
        started = time.perf_counter()
        rows = rollups_generate(world, start=start, end=end)
        setup["rollups"] = time.perf_counter() - started
        setup |= derived_build(now=now)
    else:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM metering_usagerollup")
            rows = cursor.fetchone()[0]
    connections["default"].close()

    # Two servers of the same web app: as deployed, and with each worker's
    # startup heap back in the collector's care (core.heap), as it ran before.
    arms = {}
    for arm, unfreeze in (("as deployed", ""), ("startup heap not frozen", "1")):
        port, logs = free_port(), Path(tempfile.mkdtemp(prefix="bench-pages-gc-"))
        web = ManagedProcess(
            name=f"web-{len(arms)}",
            argv=uvicorn_argv(COLLECTOR_TIMED_APP, host="127.0.0.1", port=port),
            log_path=settings.VAR_DIR / "log" / f"bench-pages-web-{len(arms)}.log",
            ready_url=f"http://127.0.0.1:{port}/healthz",
            env={"DATABASE_URL": url, "BENCH_GC_LOG": f"{logs}/", "BENCH_UNFREEZE": unfreeze},
        )
        arms[arm] = (web, f"http://127.0.0.1:{port}", logs)
    results, collectors = [], {}
    try:
        for web, _, _ in arms.values():
            web.log_path.parent.mkdir(parents=True, exist_ok=True)
            web.start()
        for web, _, _ in arms.values():
            web.wait_ready(timeout=60)
        fmt = "%Y-%m-%dT%H:00:00Z"
        fill = {"now": end.strftime(fmt), "month_ago": (end - timedelta(days=30)).strftime(fmt)}
        anonymous = [httpx.Client(base_url=base, timeout=60) for _, base, _ in arms.values()]
        floor = timed(anonymous, "/healthz", requests=args.requests)
        results.append(("—", "/healthz (the floor)", floor))
        for who, username, pages in (
            ("finance", "bench-finance", PAGES_FINANCE),
            ("tenant owner", "bench-owner", PAGES_TENANT),
        ):
            clients = [signed_in(base, username) for _, base, _ in arms.values()]
            for page in tqdm(pages, desc=f"pages as {who}"):
                path = page.format(**fill)
                results.append((who, path, timed(clients, path, requests=args.requests)))
        collectors = {arm: collector_read(logs) for arm, (_, _, logs) in arms.items()}
    finally:
        for web, _, logs in arms.values():
            web.stop()
            shutil.rmtree(logs, ignore_errors=True)
        if not args.keep:
            database_switch(home)
            databases_drop(name)

    worst = max(r[2][0]["p95"] for r in results)
    lines = [
        "| as | page | p50 ms | p95 ms | max ms | p95 / healthz p95 | KiB "
        "| heap not frozen: p95 / max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for who, path, (t, unfrozen) in results:
        shown = re.sub(r"start=[^&]+&end=.+$", "start=(30 days ago)&end=(now)", path)
        lines.append(
            f"| {who} | `{shown}` | {t['p50']:.1f} | {t['p95']:.1f} | {t['max']:.1f} "
            f"| {t['p95'] / floor[0]['p95']:.1f}x | {t['kib']:.0f} "
            f"| {unfrozen['p95']:.1f} / {unfrozen['max']:.1f} |"
        )
    lines += ["", *collector_table(collectors)]
    took = ", ".join(f"{k} {v:.0f} s" for k, v in setup.items()) or "reused"
    body = "\n".join(lines) + (
        f"\n\n{args.tenants:,} tenants, {rows:,} hourly rollup rows over {args.days} days "
        f"(one per tenant per hour), ten pools of eight GPUs, a second model in the catalogue "
        "that no book prices (so /reconciliation/ reads the rollups), the last 30 days allocated, "
        f"the month-to-date margin report built, last month invoiced (setup, not timed: "
        f"{took}). {args.requests} sequential requests per page after five warm-up ones, "
        "one uvicorn worker, a client on loopback. "
        f"Worst p95: {worst:.0f} ms; target: under 300 ms on every page: "
        f"{'met' if worst < 300 else 'NOT met'}."
    )
    report_write(
        name="pages",
        title="Dashboard pages (bench/pages.py)",
        command="./dev bench pages",
        body=body,
    )
    if worst >= 300:
        sys.exit(1)


if __name__ == "__main__":
    main()
