"""Margin reports on a schedule (a weekly flash, a monthly close) or on
request: computed from booked data (billing.reports.margins), stored as CSV and
HTML on a MarginReport row, listed and downloaded through the finance API.

The period compared with: a monthly close against the whole month before;
month to date against the same days of the month before (Nov 1-23 against
Oct 1-23; Mar 1-30 against all of Feb, clamped at its end); any other
period against as long a stretch just before it. A month-to-date report
also carries a run-rate forecast of the whole month: each figure so far
divided by the elapsed fraction of the month (time elapsed / the month's),
rounded half-even to a nano-unit; margin forecast = revenue forecast - cost
forecast. A report reaching into the current hour (the demo's, built up to
the next hour) has revenue up to the moment it was built and cost up to
the current hour's start (allocation books no hour before it is over), so
revenue is divided by the time elapsed (the current hour by its elapsed
part) and cost by the whole hours booked.

Amounts are in the reporting currency (billing.fx, billing.reports.margins). A
rate that is missing fails the report with a message naming the currency
pair and the day."""

from __future__ import annotations

import io
import logging
from datetime import datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import numpy as np
import pandas as pd
from django.template.loader import render_to_string
from django.utils import timezone

from billing.choices import ReportKind, RunStatus
from billing.errors import FxError
from billing.models import MarginReport
from billing.reports.margins import (
    LEVELS,
    LOST,
    MONEY,
    ORIGINAL,
    margin_data,
    margin_revenue_by_currency,
    margin_table,
    margin_totals,
    original_columns,
)
from billing.reports.platforms import (
    PLATFORM_KEYS,
    model_platform_frame,
    platform_frame,
    platform_table,
)
from billing.runs import run_executing, run_finish, run_start, runs_abandoned_fail
from core.calendar import day_start, hour_start, month_containing, month_start, months_add
from core.fixed_point import fixed_point
from core.nanos import from_nano
from metering.selectors.queue import gateway_queue_by_tier

logger = logging.getLogger(__name__)
MONEY_OUT = [*MONEY, LOST, "cost", "margin", "prev_revenue", "prev_cost", "prev_margin"]
TOP = ("tier", "platform")  # the tables the report draws as bars
GATEWAY_QUEUE = "gateway_queue"  # a table of the report's rows: the gateway's queue by tier
RATIOS = ["margin_pct", "utilization_pct", "revenue_change_pct", "gpu_hours"]
PER_UNIT = ["cost_per_mtok", "revenue_per_gpu_hour"]


def report_period(*, kind: str, now: datetime) -> tuple[datetime, datetime]:
    """The period a scheduled report covers: the last whole ISO week (flash),
    the last calendar month (close), or this month up to today (month to
    date; on the 1st, the whole of last month), UTC."""
    today = day_start(now)
    if kind == ReportKind.FLASH:
        monday = today - timedelta(days=today.weekday())
        return monday - timedelta(days=7), monday
    this_month = month_start(today)
    if kind == ReportKind.MONTH_TO_DATE and today > this_month:
        return this_month, today
    return months_add(this_month, -1), this_month


def previous_period(*, kind: str, start: datetime, end: datetime) -> tuple[datetime, datetime]:
    """What a report of [start, end) is compared with (see the module)."""
    if kind in (ReportKind.CLOSE, ReportKind.MONTH_TO_DATE):
        previous_start = month_start(start - timedelta(days=1))
        if kind == ReportKind.CLOSE:
            return previous_start, start
        # The same days of the month before, clamped at that month's end.
        return previous_start, min(previous_start + (end - start), start)
    return start - (end - start), start


def month_run_rate(*, start: datetime, end: datetime) -> tuple[datetime, datetime] | None:
    """The calendar month [start, end) is the beginning of, if it is one
    (starts on the 1st, ends inside that month or at its end)."""
    first, after = month_containing(start)
    if start == first and end <= after:
        return first, after
    return None


def run_rate_elapsed(*, start: datetime, end: datetime, now: datetime) -> tuple[datetime, datetime]:
    """How far the figures of a report of [start, end) built at `now`
    reach: revenue to `now` (the current hour by its elapsed part), cost to
    the current hour's start (allocation books none of it); both at most
    `end`. A report of hours all past reaches `end` with both."""
    revenue_to = min(end, now)
    cost_to = min(end, hour_start(now))
    return max(revenue_to, start), max(cost_to, start)


def run_rate_forecast(
    so_far: dict[str, int],
    *,
    start: datetime,
    end: datetime,
    month_end: datetime,
    cost_end: datetime | None = None,
) -> dict[str, int]:
    """Revenue so far over the month's fraction [start, end) is, cost so
    far over [start, cost_end) (default `end`), each rounded half-even to a
    nano-unit; margin = revenue - cost."""
    month = Decimal((month_end - start).total_seconds())

    def project(nano: int, reached: datetime) -> int:
        elapsed = Decimal((reached - start).total_seconds())
        if elapsed <= 0:
            return nano  # nothing booked yet (the month's first hour): nothing to scale
        scaled = Decimal(nano) * month / elapsed
        return int(scaled.quantize(Decimal(1), rounding=ROUND_HALF_EVEN))

    revenue = project(so_far["revenue"], end)
    cost = project(so_far["cost"], cost_end or end)
    return {"revenue": revenue, "cost": cost, "margin": revenue - cost}


def margin_report_request(
    *, kind: str, start: datetime, end: datetime, requested_by=None
) -> MarginReport:
    previous_start, previous_end = previous_period(kind=kind, start=start, end=end)
    report, _ = MarginReport.objects.update_or_create(
        kind=kind,
        period_start=start,
        period_end=end,
        defaults={
            "previous_start": previous_start,
            "previous_end": previous_end,
            "status": RunStatus.QUEUED,
            "error": "",
            "requested_by": requested_by,
        },
    )
    return report


def margin_report_build(*, report_id: int) -> MarginReport:
    report = MarginReport.objects.get(pk=report_id)
    runs_abandoned_fail(MarginReport)
    with run_executing(report):
        _build(report)
    return report


def _build(report: MarginReport) -> None:
    run_start(report)
    error: str | None = None
    try:
        now = margin_data(start=report.period_start, end=report.period_end)
        before = margin_data(start=report.previous_start, end=report.previous_period_end)
        tables = {level: margin_table(now, level, previous=before) for level in LEVELS}
        # By engine and GPU kind: what a million tokens costs and
        # a GPU-hour earns on each serving platform.
        platforms = platform_frame(
            start=report.period_start, end=report.period_end, revenue=now.detail
        )
        tables["platform"] = platform_table(platforms)
        # A model's drill-down: the model's own figures (its
        # revenue and allocated cost) on the platforms that served it, so
        # they add up to its margin row; the replicas' totals are above.
        mine = model_platform_frame(
            start=report.period_start, end=report.period_end, detail=now.detail
        )
        tables["model_platform"] = platform_table(mine, ["model", *PLATFORM_KEYS]).drop(
            columns=["busy_hours", "utilization_pct"]  # GPU-hours are the model's busy hours
        )
        totals = margin_totals(now)
        report.currency = now.currency
        report.totals = {k: fixed_point(from_nano(v)) for k, v in totals.items()} | {
            "currency": now.currency,
            "revenue_by_currency": {
                code: fixed_point(from_nano(nano))
                for code, nano in margin_revenue_by_currency(now).items()
            },
        }
        report.fx_rates = [c.as_json() for c in (*now.conversions, *before.conversions)]
        report.forecast = _forecast(report, totals, tables["tier"])
        report.csv = _csv(tables, currency=now.currency)
        context = _html_context(tables)
        report.tables = {
            level: [_json_row(row) for row in context[f"{level}s"]] for level in tables
        } | {
            # The finance overview shows it beside the report: kept with the
            # report (a month's rollups aggregated live cost that page 200 ms).
            GATEWAY_QUEUE: [
                _json_row(row)
                for row in gateway_queue_by_tier(start=report.period_start, end=report.period_end)
            ]
        }
        report.html = render_to_string("billing/margin_report.html", {"report": report, **context})
    except FxError as exc:  # a rate or a cost currency to enter: no stack trace needed
        logger.warning("margin report %s failed: %s", report.pk, exc)
        error = str(exc)
    except Exception as exc:
        logger.exception("margin report %s failed", report.pk)
        error = f"{type(exc).__name__}: {exc}"
    report.save()  # its content, as far as it was built
    run_finish(report, failed=error is not None, error=error or "")


def _forecast(report: MarginReport, totals: dict[str, int], tiers: pd.DataFrame) -> dict:
    if report.kind != ReportKind.MONTH_TO_DATE:
        return {}
    month = month_run_rate(start=report.period_start, end=report.period_end)
    if month is None:
        return {}
    start, month_end = report.period_start, month[1]
    # A report reaching into the current hour (or past it) has figures up
    # to now only: the hour is counted by its elapsed part, not whole.
    end, cost_end = run_rate_elapsed(start=start, end=report.period_end, now=timezone.now())

    def project(figures: dict) -> dict[str, str]:
        so_far = {k: int(figures[k]) for k in ("revenue", "cost")}
        forecast = run_rate_forecast(
            so_far, start=start, end=end, month_end=month_end, cost_end=cost_end
        )
        return {k: fixed_point(from_nano(v)) for k, v in forecast.items()}

    def days(moment: datetime) -> str:
        return fixed_point(Decimal((moment - start).total_seconds()) / 86400)

    return {
        "month_start": month[0].isoformat(),
        "month_end": month_end.isoformat(),
        "elapsed_days": days(end),
        "cost_elapsed_days": days(cost_end),
        "month_days": days(month_end),
        "totals": project(totals),
        "tiers": {row["tier"]: project(row) for row in tiers.to_dict("records")},
    }


def _csv(tables: dict[str, pd.DataFrame], *, currency: str) -> str:
    frames, originals = [], set()
    for level, table in tables.items():
        out = table.copy()
        originals |= set(original_columns(out))
        for column in [*MONEY_OUT, *original_columns(out)]:
            if column in out:
                out[column] = [from_nano(v) for v in out[column]]
        for column in [*RATIOS, *PER_UNIT]:
            if column in out:
                out[column] = out[column].round(4)
        out.insert(0, "level", level)
        out["currency"] = currency
        frames.append(out)
    buffer = io.StringIO()
    # `currency` is that of every amount but the revenue_in_<CUR> columns
    # (revenue as billed, in <CUR>).
    columns = ["level", "tier", "tenant_tier", "pool", "tenant", "model", *PLATFORM_KEYS]
    columns += ["currency", *MONEY_OUT]
    columns += [*sorted(originals), "tokens", "device_seconds", "busy_hours", *RATIOS, *PER_UNIT]
    combined = pd.concat(frames, ignore_index=True).reindex(columns=columns)
    # Decimals and floats as plain fixed-point text ("0.000000000", never "0E-9").
    for column in combined.columns:
        if combined[column].dtype != np.int64:
            combined[column] = combined[column].map(_csv_cell)
    combined.to_csv(buffer, index=False)
    return buffer.getvalue()


def _csv_cell(value):
    return (
        fixed_point(value) if isinstance(value, Decimal | float) else value
    )  # ok-float: a float met is written as a fixed point


def _json_row(row: dict) -> dict:
    return {
        k: (
            fixed_point(v) if isinstance(v, Decimal) else int(v) if isinstance(v, np.integer) else v
        )
        for k, v in row.items()
        if not k.endswith("_bar") and not k.startswith(ORIGINAL)
    }


def _html_context(tables: dict[str, pd.DataFrame]) -> dict:
    def rows(table: pd.DataFrame) -> list[dict]:
        out = []
        for record in table.to_dict("records"):
            for column in MONEY_OUT:
                if column in record:
                    record[column] = from_nano(record[column]).quantize(Decimal("0.01"))
            # Revenue as billed, per billing currency (those with any).
            record["revenue_by_currency"] = {
                column.removeprefix(ORIGINAL): str(
                    from_nano(record[column]).quantize(Decimal("0.01"))
                )
                for column in sorted(record)
                if column.startswith(ORIGINAL) and record[column]
            }
            for column in [*RATIOS, *PER_UNIT]:
                if column in record and (record[column] is None or np.isnan(record[column])):
                    record[column] = None
            out.append(record)
        return out

    tiers = rows(tables["tier"])
    widest = max([abs(r["revenue"]) for r in tiers] + [abs(r["cost"]) for r in tiers] + [1])
    for row in tiers:  # bar widths, percent of the widest figure
        row["revenue_bar"] = float(abs(row["revenue"]) / widest * 100)  # ok-float: display
        row["cost_bar"] = float(abs(row["cost"]) / widest * 100)  # ok-float: display
    platforms = rows(tables["platform"])
    dearest = max([r["cost_per_mtok"] or 0 for r in platforms] + [1e-12])
    for row in platforms:  # a bar per platform: its cost per million tokens
        row["cost_per_mtok_bar"] = float((row["cost_per_mtok"] or 0) / dearest * 100)  # ok-float
    return {"tiers": tiers, "platforms": platforms} | {
        f"{level}s": rows(table) for level, table in tables.items() if level not in TOP
    }
