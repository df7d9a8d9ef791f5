"""Earlier months for the demo world, so its charts show trends: synthetic
hourly usage for each demo tenant on its pool's replica (marked synthetic),
then what the platform would have done with it month by month (with demo
FX rates for the EUR tenants): allocation of the GPUs' cost, a finalized
invoice per tenant per closed month, and a monthly-close margin report per
month. Ends where today begins, so the
live workload's hours stay real. Safe to run again: the same seed writes
the same rows, finalized invoices are left alone."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.utils import timezone

from core.calendar import day_start, month_start, month_starts_between, months_add
from metering.history import HistoryStream, history_write

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class DemoTraffic:
    pool: str
    tokens_per_hour: int
    shape: str
    prompt_share: float  # ok-float: generator knobs
    cached_share: float  # ok-float
    tokens_per_request: int


# Per tenant slug: where it runs and how it uses it (see demo.seeds.tenants).
DEMO_TRAFFIC = {
    "acme": DemoTraffic("demo-dedicated-acme", 5_000_000, "business", 0.65, 0.10, 1_500),
    "globex": DemoTraffic("demo-reserved-globex", 4_000_000, "flat", 0.80, 0.25, 2_500),
    "initech": DemoTraffic("demo-shared", 2_500_000, "business", 0.85, 0.30, 3_000),
    "hooli": DemoTraffic("demo-shared", 5_000_000, "business", 0.60, 0.35, 900),
    "umbrella": DemoTraffic("demo-shared", 1_800_000, "business", 0.70, 0.10, 1_200),
    "stark": DemoTraffic("demo-shared", 4_000_000, "nightly", 0.92, 0.0, 12_000),
}


@dataclass
class HistoryReport:
    start: datetime
    end: datetime
    rows: int = 0
    allocation: str = ""
    invoices: int = 0
    reports: int = 0


def demo_history_streams() -> list[HistoryStream]:
    from demo.seeds.fleet import fleet_demo_seed
    from tenants.models import Tenant

    placements = fleet_demo_seed()
    tenants = Tenant.objects.in_bulk(DEMO_TRAFFIC, field_name="slug")
    streams = []
    for slug, traffic in DEMO_TRAFFIC.items():
        placed = placements.get(traffic.pool)
        if slug not in tenants or placed is None:
            continue
        streams.append(
            HistoryStream(
                tenant_id=tenants[slug].pk,
                replica_id=placed.replica.pk,
                pool_id=placed.pool.pk,
                served_model_id=placed.replica.model_id,
                gpus=len(placed.gpus),
                tokens_per_hour=traffic.tokens_per_hour,
                shape=traffic.shape,
                prompt_share=traffic.prompt_share,
                cached_share=traffic.cached_share,
                tokens_per_request=traffic.tokens_per_request,
            )
        )
    return streams


def demo_history_fill(
    *,
    months: int,
    now: datetime | None = None,
    seed: int = 7,
    progress: Callable[[str, int, int], None] | None = None,
) -> HistoryReport:
    """Fill the `months` whole months before this one and this month up to
    today: usage, allocation, invoices for the closed months, and margin
    reports. `progress(step, done, total)` follows each step."""
    from billing.choices import ReportKind
    from billing.costs.runs import allocation_run_create, allocation_run_execute
    from billing.invoicing.runs import invoice_run_create, invoice_run_execute
    from billing.reports.margin_reports import margin_report_build, margin_report_request
    from demo.seeds.billing import SINCE, fx_rates_demo_seed

    def step(name: str) -> Progress:
        return lambda done, total: progress(name, done, total) if progress else None

    now = (now or timezone.now()).astimezone(UTC)
    end = day_start(now)
    first = months_add(month_start(end), -max(months, 0))
    report = HistoryReport(start=first, end=end)
    if months <= 0 or end <= first:
        return report
    report.rows = history_write(
        demo_history_streams(), start=first, end=end, seed=seed, progress=step("usage")
    )
    # Demo FX rates (marked as such) for the history and today, so the
    # margin reports can convert the EUR tenants' revenue.
    fx_rates_demo_seed(start=min(first, SINCE).date(), end=now.date())
    run = allocation_run_create(start=first, end=end)
    report.allocation = allocation_run_execute(run_id=run.pk, progress=step("allocation")).status
    closed = month_starts_between(first, end)[1:]  # the first instant after each closed month
    for n, month_end in enumerate(closed, start=1):
        # Issued when the month's run would have run: due NET_DAYS after
        # that, so past invoices age as real ones do.
        issued = month_end + timedelta(hours=2)
        run = invoice_run_execute(run_id=invoice_run_create(as_of=issued, issued_at=issued).pk)
        report.invoices += run.invoices_created
        step("invoices")(n, len(closed))
    months_done = month_starts_between(first, end)
    for n, month_first in enumerate(months_done[:-1], start=1):
        month_end = months_done[n]
        request = margin_report_request(kind=ReportKind.CLOSE, start=month_first, end=month_end)
        margin_report_build(report_id=request.pk)
        report.reports += 1
        step("margin reports")(n, len(months_done))
    if end > months_done[-1]:  # this month so far
        request = margin_report_request(
            kind=ReportKind.MONTH_TO_DATE, start=months_done[-1], end=end
        )
        margin_report_build(report_id=request.pk)
        report.reports += 1
    step("margin reports")(len(months_done), len(months_done))
    return report
