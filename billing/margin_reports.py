"""Margin reports on a schedule (a weekly flash, a monthly close) or on
request: computed from booked data (billing.margins), stored as CSV and
HTML on a MarginReport row, listed and downloaded through the finance API."""

from __future__ import annotations

import io
import logging
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import numpy as np
import pandas as pd
from django.template.loader import render_to_string
from django.utils import timezone

from billing.choices import ReportKind, RunStatus
from billing.margins import LEVELS, MONEY, margin_data, margin_table, margin_totals
from billing.models import MarginReport
from billing.money import from_nano
from billing.periods import period_containing

logger = logging.getLogger(__name__)
MONEY_OUT = [*MONEY, "cost", "margin", "prev_revenue", "prev_cost", "prev_margin"]
RATIOS = ["margin_pct", "utilization_pct", "revenue_change_pct", "gpu_hours"]
PER_UNIT = ["cost_per_mtok", "revenue_per_gpu_hour"]


def report_period(*, kind: str, now: datetime) -> tuple[datetime, datetime]:
    """The period a scheduled report covers: the last whole ISO week (flash),
    the last calendar month (close), or this month up to today (month to
    date; on the 1st, the whole of last month), UTC."""
    today = now.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    if kind == ReportKind.FLASH:
        monday = today - timedelta(days=today.weekday())
        return monday - timedelta(days=7), monday
    this_month, _ = period_containing(anchor_day=1, moment=today)
    if kind == ReportKind.MONTH_TO_DATE and today > this_month:
        return this_month, today
    return period_containing(anchor_day=1, moment=this_month - timedelta(days=1))


def margin_report_request(
    *, kind: str, start: datetime, end: datetime, requested_by=None
) -> MarginReport:
    if kind in (ReportKind.CLOSE, ReportKind.MONTH_TO_DATE):
        # Against the whole previous month.
        previous_start, _ = period_containing(anchor_day=1, moment=start - timedelta(days=1))
    else:
        previous_start = start - (end - start)
    report, _ = MarginReport.objects.update_or_create(
        kind=kind,
        period_start=start,
        period_end=end,
        defaults={
            "previous_start": previous_start,
            "status": RunStatus.QUEUED,
            "error": "",
            "requested_by": requested_by,
        },
    )
    return report


def margin_report_build(*, report_id: int) -> MarginReport:
    report = MarginReport.objects.get(pk=report_id)
    MarginReport.objects.filter(pk=report.pk).update(status=RunStatus.RUNNING)
    try:
        now = margin_data(start=report.period_start, end=report.period_end)
        before = margin_data(start=report.previous_start, end=report.period_start)
        tables = {level: margin_table(now, level, previous=before) for level in LEVELS}
        report.totals = {k: str(from_nano(v)) for k, v in margin_totals(now).items()}
        report.csv = _csv(tables)
        context = _html_context(tables)
        report.tables = {
            level: [_json_row(row) for row in context[f"{level}s"]] for level in LEVELS
        }
        report.html = render_to_string("billing/margin_report.html", {"report": report, **context})
        report.status, report.error = RunStatus.DONE, ""
    except Exception as exc:
        logger.exception("margin report %s failed", report.pk)
        report.status, report.error = RunStatus.FAILED, f"{type(exc).__name__}: {exc}"
    report.finished_at = timezone.now()
    report.save()
    return report


def _csv(tables: dict[str, pd.DataFrame]) -> str:
    frames = []
    for level, table in tables.items():
        out = table.copy()
        for column in MONEY_OUT:
            if column in out:
                out[column] = [from_nano(v) for v in out[column]]
        for column in [*RATIOS, *PER_UNIT]:
            if column in out:
                out[column] = out[column].round(4)
        out.insert(0, "level", level)
        frames.append(out)
    buffer = io.StringIO()
    columns = ["level", "tier", "pool", "tenant", "model", *MONEY_OUT, "tokens"]
    columns += ["device_seconds", *RATIOS, *PER_UNIT]
    combined = pd.concat(frames, ignore_index=True)
    combined.reindex(columns=columns).to_csv(buffer, index=False)
    return buffer.getvalue()


def _json_row(row: dict) -> dict:
    return {
        k: (str(v) if isinstance(v, Decimal) else int(v) if isinstance(v, np.integer) else v)
        for k, v in row.items()
        if not k.endswith("_bar")
    }


def _html_context(tables: dict[str, pd.DataFrame]) -> dict:
    def rows(table: pd.DataFrame) -> list[dict]:
        out = []
        for record in table.to_dict("records"):
            for column in MONEY_OUT:
                if column in record:
                    record[column] = from_nano(record[column]).quantize(Decimal("0.01"))
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
    return {"tiers": tiers} | {
        f"{level}s": rows(tables[level]) for level in LEVELS if level != "tier"
    }
