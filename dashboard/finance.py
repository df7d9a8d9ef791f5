"""Finance pages. The overview: revenue, cost and margin by tier this month
so far against the same days of last month (a chart) with a run-rate
forecast of the whole month, unabsorbed idle cost, and margin by tenant
and by model (sortable), each tenant a link to its drill-down (its usage,
spend, invoices, requests and margin). Every figure is in the report's
currency (the reporting currency), revenue billed in other currencies
converted at the rates the report lists. It reads the stored
month-to-date margin report (computed nightly, or on request), never rating
live, so it stays fast; a newer report that failed (a missing FX rate, say)
is shown with its reason. Beside it, from the usage rollups: the time
requests waited in the gateway's queue by tier over the report's period,
and a chart of the queue's mean depth by tier, hour by hour, over the last
48 hours.
Reconciliation: tokens vLLM served that metering did not record (so nobody
was billed for them), window by window."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.core.exceptions import ObjectDoesNotExist
from django.http import Http404
from django.shortcuts import render
from django.utils import timezone

from billing.choices import ReportKind
from billing.costs.selectors import margin_report_failed_after, margin_report_latest
from billing.invoicing.reproduction import reproduction_latest
from billing.pricing.unbilled import unpriced_usage
from billing.reports.margin_reports import GATEWAY_QUEUE
from billing.spend.corrections import spend_drift_latest
from dashboard.forms import PeriodFilterForm
from dashboard.portal import usage_context, usage_days
from metering.selectors.queue import gateway_queue_by_tier, gateway_queue_depth_by_hour
from metering.selectors.reconciliation import (
    phases_unpaired,
    reconciliation_by_replica,
    reconciliation_coverage,
    reconciliation_gaps,
)
from planning.selectors import plan_run_latest_done
from serving.selectors import served_model_get
from tenants.access import finance_staff_required
from tenants.selectors import tenant_for_finance

MODEL_TENANTS_SHOWN = 50  # the rest are in the report's CSV
QUEUE_DEPTH_HOURS = 48
RECONCILIATION_DAYS = {"1": 1, "7": 7, "30": 30}
PREVIOUS_LABEL = {
    ReportKind.MONTH_TO_DATE: "same days last month",
    ReportKind.CLOSE: "last month",
}


def report_context(report) -> dict:
    """What every page showing a stored report says about it: its currency,
    the period it is compared with, the FX rates it used, the run-rate
    forecast, and a newer report that failed."""
    context = {
        "report": report,
        "report_failed": margin_report_failed_after(report=report),
        "plan": plan_run_latest_done(),  # the plan report, beside the margin report
    }
    if report is None:
        return context
    forecast = dict(report.forecast or {})
    for key in ("month_start", "month_end"):
        if key in forecast:
            forecast[key] = datetime.fromisoformat(forecast[key])
    return context | {
        "report_currency": report.currency,
        "previous_end": report.previous_period_end,
        "previous_label": PREVIOUS_LABEL.get(report.kind, "previous period"),
        "fx_rates": [
            rate
            | {
                "period_start": datetime.fromisoformat(rate["period_start"]),
                "period_end": datetime.fromisoformat(rate["period_end"]),
            }
            for rate in report.fx_rates or []
        ],
        "forecast": forecast,
    }


@finance_staff_required
def finance_overview(request):
    report = margin_report_latest()
    tables = report.tables if report else {}
    tiers = tables.get("tier", [])
    forecast_tiers = (report.forecast or {}).get("tiers", {}) if report else {}
    for row in tiers:
        row["forecast"] = forecast_tiers.get(row["tier"])
    previous = PREVIOUS_LABEL.get(report.kind, "previous period") if report else ""
    chart = {
        "labels": [row["tier"] for row in tiers],
        "datasets": [
            {"label": label, "data": [float(row[key]) for row in tiers]}  # ok-float: chart
            for label, key in (
                ("Revenue", "revenue"),
                ("Cost", "cost"),
                ("Margin", "margin"),
                (f"Margin, {previous}", "prev_margin"),
            )
        ],
    }
    context = report_context(report) | {
        "tiers": tiers,
        "tenant_tiers": tables.get("tenant_tier", []),
        "tenants": tables.get("tenant", []),
        "models": tables.get("model", []),
        "pools": tables.get("pool", []),
        "chart": chart,
        "gateway_queue": _gateway_queue(report),
        "queue_depth_chart": queue_depth_chart(now=timezone.now()),
        "reproduction": reproduction_latest(),
    }
    return render(request, "dashboard/finance.html", context)


def _gateway_queue(report) -> list[dict]:
    """The gateway's queue by tier over the report's period, as the report
    was built with it (reports built before it kept one: from the rollups)."""
    if report is None:
        return []
    if GATEWAY_QUEUE in report.tables:
        return report.tables[GATEWAY_QUEUE]
    return gateway_queue_by_tier(start=report.period_start, end=report.period_end)


def queue_depth_chart(*, now: datetime, hours: int = QUEUE_DEPTH_HOURS) -> dict:
    """The gateway queue's mean depth per tier, hour by hour, over the last
    `hours` hours up to the current one (an hour without usage: 0)."""
    end = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    start = end - timedelta(hours=hours)
    index = {start + timedelta(hours=n): n for n in range(hours)}
    series: dict[str, list] = {}
    for row in gateway_queue_depth_by_hour(start=start, end=end):
        points = series.setdefault(row["tier"], [0.0] * hours)
        points[index[row["hour"]]] = float(row["depth"])  # ok-float: a chart point
    return {
        "labels": [f"{hour:%m-%d %H}h" for hour in index],
        "datasets": [{"label": tier, "data": data} for tier, data in sorted(series.items())],
    }


@finance_staff_required
def finance_tenant(request, slug: str):
    try:
        tenant = tenant_for_finance(slug=slug)
    except ObjectDoesNotExist:
        raise Http404("no such tenant") from None
    context = usage_context(tenant=tenant, days=usage_days(request))
    report = margin_report_latest()
    rows = report.tables.get("tenant", []) if report else []
    context |= report_context(report) | {
        "drill": True,
        "margin": next((row for row in rows if row["tenant"] == slug), None),
        "tenant_param": f"&tenant={slug}",
    }
    return render(request, "dashboard/usage.html", context)


@finance_staff_required
def reconciliation(request):
    days = PeriodFilterForm(request.GET, periods=RECONCILIATION_DAYS, default=7).days_value()
    end = timezone.now()
    start = end - timedelta(days=days)
    gaps, totals = reconciliation_gaps(start=start, end=end)
    unpriced = unpriced_usage(start=start.replace(minute=0, second=0, microsecond=0), end=end)
    context = {
        "gaps": gaps,
        "totals": totals,
        "coverage": reconciliation_coverage(start=start, end=end),
        "unpriced": unpriced,
        "unpriced_tokens": sum(row["tokens"] for row in unpriced),
        "drifts": spend_drift_latest(),
        "replicas": reconciliation_by_replica(start=start, end=end),
        "unpaired": phases_unpaired(start=start, end=end, now=end),
        "days": days,
        "start": start,
        "end": end,
    }
    return render(request, "dashboard/reconciliation.html", context)


@finance_staff_required
def finance_model(request, name: str):
    """One model, from the stored margin report like the overview: its
    margin, where it ran (revenue, cost and cost per million tokens by
    pool, and by engine and GPU kind: the model's own figures, adding up
    to its margin, not the replicas' totals) and who used it (the heaviest
    tenants by tokens, with margin)."""
    try:
        model = served_model_get(name=name)
    except ObjectDoesNotExist:
        raise Http404("no such model") from None
    report = margin_report_latest()
    tables = report.tables if report else {}

    def rows(level: str) -> list[dict]:
        return [row for row in tables.get(level, []) if row["model"] == name]

    tenants = sorted(rows("model_tenant"), key=lambda row: (-row["tokens"], row["tenant"]))
    context = report_context(report) | {
        "model": model,
        "margin": next(iter(rows("model")), None),
        "pools": rows("model_pool"),
        "platforms": rows("model_platform"),
        "tenants": tenants[:MODEL_TENANTS_SHOWN],
        "tenants_total": len(tenants),
    }
    return render(request, "dashboard/finance_model.html", context)
