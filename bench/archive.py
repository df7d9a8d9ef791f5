"""bench/archive: archiving a month of the raw ledger (metering.archive).

A month long past the retention horizon filled with N events (10 million
by default: a month of a busy tier) and their idempotency keys, straight
in SQL; then the archive's four steps timed one by one: export to Parquet,
verify by reading back, prune the keys, detach and drop; with this
process's peak memory. A month of 1 million and one of 10 million by default,
side by side.

    ./dev bench archive [--events 1000000,10000000]

Prints the table and writes it to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

from django.db import connection  # noqa: E402
from psycopg import sql  # noqa: E402

from bench.common import PeakRss, bench_database, report_write  # noqa: E402
from bench.gateway import bench_tenant  # noqa: E402
from metering import archive  # noqa: E402
from metering.models import UsageArchive  # noqa: E402
from metering.partitions import partition_name, usage_partitions_ensure  # noqa: E402

MONTH = datetime(2024, 1, 1, tzinfo=UTC)  # far past any horizon

FILL = """
INSERT INTO {partition}
    (request_id, tenant_id, api_key_id, model, priority, stream, prompt_tokens,
     cached_tokens, completion_tokens, received_at, sent_at, first_token_at, ended_at,
     queue_ms, ttft_ms, generation_ms, status, http_status, source)
SELECT 'bench-archive-' || g, %(tenant)s, NULL, 'bench-model', 0, g %% 2 = 0,
       200 + g %% 1000, g %% 100, 50 + g %% 300,
       t, t, t + interval '120 ms', t + interval '2 s',
       (g %% 50)::numeric / 10, 120.5, 1880.25, 'ok', 200, 'api'
FROM generate_series(1, %(events)s) g,
     LATERAL (SELECT %(month)s::timestamptz + (g * interval '2678 s') / %(scale)s AS t) s
"""
KEYS = """
INSERT INTO metering_usagekey (request_id, phase, received_at)
SELECT request_id, phase, received_at FROM {partition}
"""


def timed(label: str, function, *args, **kwargs):
    print(f"{label} …", flush=True)
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def month_archived(events: int, tenant_id: int, target: Path) -> dict:
    """A month of `events` filled, then archived step by step: what each took."""
    partition = partition_name(MONTH)
    name = sql.Identifier(partition)
    UsageArchive.objects.filter(month=MONTH).delete()
    with connection.cursor() as cursor:
        cursor.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(name))
        cursor.execute("DELETE FROM metering_usagekey WHERE request_id LIKE 'bench-archive-%%'")
    usage_partitions_ensure(months=[MONTH])

    def fill():
        with connection.cursor() as cursor:
            # One month: 31 days of seconds spread over the events.
            cursor.execute(
                sql.SQL(FILL).format(partition=name),
                {"tenant": tenant_id, "events": events, "month": MONTH, "scale": events / 1000},
            )
            cursor.execute(sql.SQL(KEYS).format(partition=name))
            cursor.execute(sql.SQL("ANALYZE {}").format(name))
            cursor.execute("SELECT pg_total_relation_size(%s)", [partition])
            return cursor.fetchone()[0]

    table_bytes, filled = timed(f"filling {events:,} events", fill)
    steps = {}
    with PeakRss() as peak:
        exported, took = timed("export", archive._export, MONTH, str(target), None)
        steps["export to Parquet"] = (took, peak.take())
        _, took = timed("verify", archive._verify, exported)
        steps["verify (read back)"] = (took, peak.take())
        _, took = timed("prune keys", archive._prune_keys, exported, None)
        steps["prune the keys"] = (took, peak.take())
        _, took = timed("drop", archive._drop, exported)
        steps["detach and drop"] = (took, peak.take())
    exported.refresh_from_db()
    UsageArchive.objects.filter(month=MONTH).delete()
    return {"archive": exported, "steps": steps, "table_bytes": table_bytes, "filled": filled}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--events", default="1000000,10000000", help="months' sizes, comma-separated"
    )
    args = parser.parse_args()
    sizes = [int(n) for n in args.events.split(",")]
    bench_database("bench_archive")  # a database of its own, migrated
    tenant, _ = bench_tenant()
    target = Path(tempfile.mkdtemp(prefix="bench-archive-", dir=Path.home()))
    runs = {events: month_archived(events, tenant.pk, target) for events in sizes}
    shutil.rmtree(target, ignore_errors=True)
    lines = [
        "A month of N events filled straight in SQL, then archived step by step. Peak "
        "memory: this process's resident set during the step.",
        "",
        "| events in the month | in PostgreSQL | Parquet (zstd) | bytes / event |",
        "|---|---|---|---|",
        *(
            f"| {events:,} | {r['table_bytes'] / 2**30:.2f} GiB | "
            f"{r['archive'].bytes / 2**20:,.0f} MiB | {r['archive'].bytes / events:.1f} |"
            for events, r in runs.items()
        ),
        "",
        "| step | " + " | ".join(f"{e:,}: seconds, events / s, peak MiB" for e in runs) + " |",
        "|---|" + "---|" * len(runs),
    ]
    for step in next(iter(runs.values()))["steps"]:
        cells = []
        for events, r in runs.items():
            took, rss = r["steps"][step]
            cells.append(f"{took:.1f} s, {events / took:,.0f}, {rss:,.0f}")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    totals = []
    for events, r in runs.items():
        total = sum(t for t, _ in r["steps"].values())
        totals.append(f"{total:.1f} s, {events / total:,.0f}")
    lines += [
        "| the whole archive | " + " | ".join(totals) + " |",
        "",
        "The rows stream (PostgreSQL's COPY, Arrow's CSV reader, the Parquet writer one "
        "batch at a time); the peak rises with the month only by what the Parquet writer "
        "holds outside Arrow's memory pool. The drop holds the ledger's lock for one count "
        "of the partition and the detach: writers to other months wait that long.",
    ]
    report_write(
        name="archive",
        title="Archiving a month of the ledger (bench/archive.py)",
        command=f"./dev bench archive --events {args.events}",
        body="\n".join(lines),
    )


if __name__ == "__main__":
    main()
