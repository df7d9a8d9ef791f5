"""A plan run as a report, beside the margin reports: one CSV of every
section (pools' GPUs needed and flags, price floors by token kind,
capacity per replica, the forecasts' summaries; a `section` column tells
them apart) and a self-contained HTML page, both read from the run's
stored rows. The weekly run (Mondays, after the weekly margin flash) is
the weekly plan report."""

from __future__ import annotations

import csv
import io

from django.template.loader import render_to_string

from planning.floors import KINDS
from planning.models import PlanRun
from planning.selectors import capacity_list, floor_list, forecast_list, pool_plan_list

COLUMNS = [
    "section",
    "pool",
    "kind",
    "tier",
    "model",
    "replica",
    "token_kind",
    "gpus_held",
    "gpus_needed",
    "gpus_contracted",
    "flags",
    "busy_percent",
    "cost",
    "idle_cost",
    "credits_at_risk",
    "price_today",
    "price_floor",
    "revenue_today",
    "margin_percent_today",
    "capacity_status",
    "tokens_per_hour",
    "forecast_method",
    "forecast_mase",
    "forecast_total",
    "forecast_peak",
    "currency",
    "note",
]


def _forecast_rows(run: PlanRun) -> list[dict]:
    rows = []
    for f in forecast_list(run=run):
        mase = f.mase.get(f.method)
        rows.append(
            {
                "section": f"forecast_{f.metric}",
                "pool": f.pool_name,
                "model": f.model_name,
                "forecast_method": f.method,
                "forecast_mase": "" if mase is None else f"{mase:.4f}",
                "forecast_total": f"{sum(f.point):.0f}",
                "forecast_peak": f"{max(f.point, default=0):.0f}",
            }
        )
    return rows


def plan_report_rows(run: PlanRun) -> list[dict]:
    rows = []
    for p in pool_plan_list(run=run):
        rows.append(
            {
                "section": "pool",
                "pool": p.pool_name,
                "kind": p.kind,
                "gpus_held": p.gpus_held,
                "gpus_needed": p.gpus_needed,
                "gpus_contracted": p.gpus_contracted,
                "flags": " ".join(p.flags),
                "busy_percent": p.busy_percent,
                "cost": p.cost,
                "idle_cost": p.idle_cost,
                "credits_at_risk": p.credits_at_risk,
                "currency": run.currency,
                "note": "; ".join(f"{m['model']}: {m['note']}" for m in p.by_model),
            }
        )
    for f in floor_list(run=run):
        for kind in KINDS:
            rows.append(
                {
                    "section": "price_floor",
                    "tier": f.tier,
                    "model": f.model_name,
                    "token_kind": kind,
                    "price_today": f.today.get(kind, ""),
                    "price_floor": (f.floor or {}).get(kind, ""),
                    "cost": f.cost,
                    "revenue_today": f.revenue,
                    "margin_percent_today": f.margin_percent,
                    "currency": run.currency,
                    "note": f.note,
                }
            )
    for c in capacity_list(run=run):
        rows.append(
            {
                "section": "capacity",
                "pool": c.pool_name,
                "model": c.model_name,
                "replica": c.replica_name,
                "capacity_status": c.status,
                "tokens_per_hour": c.tokens_per_hour,
                "note": c.note,
            }
        )
    return rows + _forecast_rows(run)


def plan_report_csv(run: PlanRun) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in plan_report_rows(run):
        writer.writerow({k: "" if v is None else v for k, v in row.items()})
    return buffer.getvalue()


def plan_report_html(run: PlanRun) -> str:
    rows = plan_report_rows(run)
    sections = {}
    for row in rows:
        sections.setdefault(row["section"], []).append(row)
    return render_to_string(
        "planning/plan_report.html",
        {
            "run": run,
            "pools": sections.get("pool", []),
            "floors": sections.get("price_floor", []),
            "capacities": sections.get("capacity", []),
            "forecasts": sections.get("forecast_tokens", []),
        },
    )
