"""bench/forecast: the demand forecast's error on data whose pattern is
known, and its run time at operator scale.

1. Accuracy: a generated year of hourly demand (a daily swing of +-50%,
   weekends at 60%, with and without 50% growth a year, at three noise
   levels) forecast for the month after; the error against the pattern
   itself (MAPE), the method the backtest chose, both methods' backtest
   MASE, how often the 80% and 95% bands held a noisy month.
2. Scale: in a database of its own, T tenants (1,000) each calling M
   models (10) on their tier's pool (8 pools: 4 shared, 3 reserved, 1
   dedicated tier's; tenants spread over them) for D days (365) of hourly
   rollups with that pattern, written by PostgreSQL itself
   (generate_series); then every pool's and model's forecast
   (planning.demand.demand_forecasts, both metrics) timed on one core
   (the query's parallel workers off), the read and the fits apart.

    ./dev bench forecast [--tenants 1000] [--models 10] [--days 365]

Prints the tables and writes them to docs/benchmarks.md."""

from __future__ import annotations

import argparse
import os
import time
from datetime import UTC, datetime, timedelta

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

import numpy as np  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.common import database_settle, database_switch, databases_drop, report_write  # noqa: E402
from planning.forecast import HORIZON, WEEK, forecast_series  # noqa: E402

DATABASE = "gpu_ledger_bench_forecast"
YEAR = 52 * WEEK
POOLS = [("shared", 4), ("reserved", 3), ("dedicated", 1)]


def pattern(hours: np.ndarray, *, growth: float) -> np.ndarray:
    daily = 1 + 0.5 * np.sin(2 * np.pi * ((hours % 24) - 8) / 24)
    weekend = np.where((hours // 24) % 7 >= 5, 0.6, 1.0)
    return 1000 * daily * weekend * (1 + growth * hours / YEAR)


def accuracy() -> list[str]:
    lines = [
        "| growth a year | noise an hour | method chosen | MAPE, month after (vs the pattern) "
        "| backtest MASE: Holt-Winters / last week | 80% band held | 95% band held | fit |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for growth in (0.0, 0.5):
        for noise in (0.05, 0.10, 0.20):
            rng = np.random.default_rng(7)
            observed = pattern(np.arange(YEAR), growth=growth)
            observed = np.maximum(observed * (1 + noise * rng.standard_normal(YEAR)), 0)
            truth = pattern(np.arange(YEAR, YEAR + HORIZON), growth=growth)
            started = time.perf_counter()
            forecast = forecast_series(observed)
            took = time.perf_counter() - started
            actual = truth * (1 + noise * rng.standard_normal(HORIZON))
            held = {
                k: float(np.mean((actual >= lo) & (actual <= hi)))
                for k, (lo, hi) in forecast.bands.items()
            }
            mape = float(np.mean(np.abs(forecast.point - truth) / truth))
            lines.append(
                f"| {growth:.0%} | {noise:.0%} | {forecast.method} | {mape:.1%} | "
                f"{forecast.mase['ets']:.2f} / {forecast.mase['seasonal_naive']:.2f} | "
                f"{held['80']:.0%} | {held['95']:.0%} | {took * 1000:.0f} ms |"
            )
            print(lines[-1], flush=True)
    return lines


def _fleet(tenants: int, models: int) -> tuple[list[int], list[int], list[int]]:
    from serving.models import Pool, ServedModel
    from tenants.models import Tenant

    pools = [
        Pool.objects.create(name=f"{kind}-{n}", kind="shared").pk
        for kind, count in POOLS
        for n in range(count)
    ]
    model_ids = [ServedModel.objects.create(name=f"model-{n:02d}").pk for n in range(models)]
    Tenant.objects.bulk_create(
        [Tenant(name=f"Forecast bench {n:05d}", slug=f"fb-{n:05d}") for n in range(tenants)]
    )
    return list(Tenant.objects.order_by("pk").values_list("pk", flat=True)), pools, model_ids


def _ledger(
    *, tenants: list[int], pools: list[int], models: list[int], start: datetime, days: int
) -> int:
    """Every tenant's every model, every hour, by INSERT … SELECT a month at
    a time (progress printed): a tenant's pool by its number; tokens by the
    pattern (a year's 50% growth) with 10% noise; a request per 1,000
    tokens. Loaded as a bulk load is: the table unlogged (no WAL: this
    database is the bench's own, dropped after), its triggers off (the
    daily totals, and the foreign keys' checks: the rows are made from the
    fleet just written) and its indexes dropped while it fills; the hour
    index, the one a forecast reads through, built after."""
    written = 0
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE metering_usagerollup DISABLE TRIGGER ALL")
        cursor.execute("ALTER TABLE metering_usagerollup SET UNLOGGED")  # a bench's own copy
        cursor.execute("ALTER TABLE metering_usagerollup DROP CONSTRAINT rollup_unique")
        cursor.execute("DROP INDEX rollup_tenant_hour, rollup_hour")
        for first_day in range(0, days, 30):
            first = start + timedelta(days=first_day)
            last = start + timedelta(days=min(days, first_day + 30)) - timedelta(hours=1)
            cursor.execute(
                INSERT,
                {
                    "pools": pools,
                    "npools": len(pools),
                    "start": start,
                    "first": first,
                    "last": last,
                    "tenants": tenants,
                    "models": models,
                },
            )
            written += cursor.rowcount
            print(f"  {min(days, first_day + 30)} of {days} days: {written:,} rollups", flush=True)
        cursor.execute("CREATE INDEX rollup_hour ON metering_usagerollup (hour)")
    return written


INSERT = """
WITH hours AS (
  SELECT h, 10 * (1 + 0.5 * sin(2 * pi() * (extract(hour FROM h) - 8) / 24))
            * CASE WHEN extract(isodow FROM h) >= 6 THEN 0.6 ELSE 1 END
            * (1 + 0.5 * extract(epoch FROM h - %(start)s::timestamptz) / 31449600) AS level
  FROM generate_series(%(first)s::timestamptz, %(last)s::timestamptz, interval '1 hour') AS h
), tenants AS (
  SELECT id, (%(pools)s::bigint[])[1 + (row_number() OVER (ORDER BY id)) %% %(npools)s] AS pool
  FROM unnest(%(tenants)s::bigint[]) AS id
), demand AS (
  SELECT hours.h, tenants.id AS tenant, tenants.pool, m.id AS model,
         round(hours.level * (0.827 + 0.346 * random()))::bigint AS tokens  -- 10%% noise
  FROM hours CROSS JOIN tenants CROSS JOIN unnest(%(models)s::bigint[]) AS m(id)
)
INSERT INTO metering_usagerollup
  (hour, tenant_id, served_model_id, pool_id, replica_id, priority,
   prompt_tokens, cached_tokens, completion_tokens, requests_ok, requests_aborted,
   requests_error, requests_rejected, device_seconds, synthetic)
SELECT h, tenant, model, pool, NULL, 0, tokens * 0.6, 0, tokens * 0.4,
       greatest(tokens / 1000, 1), 0, 0, 0, 0, true
FROM demand
"""


def scale(args) -> list[str]:
    from planning import demand

    home = connection.settings_dict["NAME"]
    database_switch(DATABASE, create=True)
    try:
        call_command("migrate", verbosity=0)
        tenants, pools, models = _fleet(args.tenants, args.models)
        end = datetime(2026, 11, 2, tzinfo=UTC)
        start = end - timedelta(days=args.days)
        print(
            f"writing {args.tenants:,} tenants x {args.models} models x {args.days * 24:,} hours",
            flush=True,
        )
        started = time.perf_counter()
        rows = _ledger(tenants=tenants, pools=pools, models=models, start=start, days=args.days)
        written = time.perf_counter() - started
        print(f"{rows:,} rollups in {written:.0f} s", flush=True)
        database_settle("metering_usagerollup")
        with connection.cursor() as cursor:
            cursor.execute("SET max_parallel_workers_per_gather = 0")  # one core
        reading = {}
        real_frame = demand.demand_frame

        def timed_frame(**kwargs):
            began = time.perf_counter()
            frame = real_frame(**kwargs)
            reading["s"] = time.perf_counter() - began
            reading["rows"] = len(frame)
            return frame

        demand.demand_frame = timed_frame
        began = time.perf_counter()
        found = demand.demand_forecasts(now=end)
        total = time.perf_counter() - began
        demand.demand_frame = real_frame
        methods = {}
        for series in found:
            methods[series.forecast.method] = methods.get(series.forecast.method, 0) + 1
        errors = [s.forecast.error for s in found if s.forecast.error is not None]
    finally:
        database_switch(home)
        databases_drop(DATABASE)
    return [
        "| tenants x models | hours of rollups | rollups | series (pool x model x metric) "
        "| read (SQL) | fits | total | methods chosen | backtest MASE, median |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {args.tenants:,} x {args.models} | {args.days * 24:,} | {rows:,} | {len(found)} | "
        f"{reading['s']:.1f} s ({reading['rows']:,} series-hours) | {total - reading['s']:.1f} s | "
        f"**{total:.1f} s** | {', '.join(f'{k} {v}' for k, v in sorted(methods.items()))} | "
        f"{float(np.median(errors)):.2f} |",
        "",
        f"The ledger written by PostgreSQL in {written:.0f} s (not part of the forecast). "
        "A forecast reads the last 10 weeks of the year (8 to fit, 2 to backtest) through the "
        "hour index; one core: no parallel query workers, the fits in one Python process. "
        "Every series here has the same shape, so the fits' time is the part that grows with "
        "pools x models, the read's with tenants x models.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--models", type=int, default=10)
    parser.add_argument("--days", type=int, default=365)
    args = parser.parse_args()
    forecast_series(pattern(np.arange(3 * WEEK + 2 * WEEK), growth=0.0))  # statsmodels loaded
    body = ["### Accuracy on a generated year with a known pattern", "", *accuracy(), ""]
    body += ["### Run time at scale", "", *scale(args)]
    report_write(
        name="forecast",
        title="Demand forecasts: error on a known pattern, run time at scale (bench/forecast.py)",
        command=(
            f"./dev bench forecast --tenants {args.tenants} --models {args.models} "
            f"--days {args.days}"
        ),
        body="\n".join(body),
    )


if __name__ == "__main__":
    main()
