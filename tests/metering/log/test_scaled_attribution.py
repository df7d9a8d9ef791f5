"""Attribution on the scaled path gives what the ledger's path gives, to
the device-nanosecond, per window, per group and per request: the same
history recorded into the PostgreSQL ledger and attributed there, then
published to a three-node JetStream cluster, written into the Delta table
by a `manage.py usage_writer` process and attributed on a Dask cluster of
two worker processes, one of them SIGKILLed while it holds a replica's
task (the scheduler runs it again elsewhere)."""

from __future__ import annotations

import os
import random
import threading
from collections import Counter
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from billing.choices import ReportKind
from billing.costs.runs import allocation_run_create, allocation_run_execute
from billing.invoicing.invoices import invoice_draft_build
from billing.models import (
    AllocationRun,
    CostAllocation,
    FxRate,
    Invoice,
    MarginReport,
)
from billing.pricing.periods import tenant_period
from billing.reports.margin_reports import margin_report_build, margin_report_request
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.log.publisher import Publisher
from metering.log.store import RawStore
from metering.models import (
    AttributionShare,
    AttributionWindow,
    ReplicaLoadHour,
    RequestShares,
    UsageRollup,
)
from metering.rollups import hour_floor
from metering.selectors.slo import slo_figures
from metering.windows import attribution_windows_due
from serving.models import Gpu
from tests.factories import make_list_price
from tests.usage_log import (
    history_records,
    ledger_truncate,
    log_config,
    log_env,
    start_writer,
    wait_for,
    wait_for_stream,
)

pytestmark = pytest.mark.django_db(transaction=True)

# CI runs 60,000; SCALED_DIFF_EVENTS=1000000 runs the million
# (about ten minutes here: the writer takes some 30,000 events a second).
YEAR = timedelta(days=365)
EVENTS = int(os.environ.get("SCALED_DIFF_EVENTS", "60000"))


def attribution_snapshot() -> dict:
    windows = {
        (w.replica_id, w.start): (w.capacity_ns, w.attributed_ns, w.idle_ns, w.requests, w.status)
        for w in AttributionWindow.objects.all()
    }
    shares = sorted(
        AttributionShare.objects.values_list(
            "window__replica_id",
            "window__start",
            "tenant_id",
            "served_model_id",
            "pool_id",
            "priority",
            "requests",
            "device_ns",
        )
    )
    per_request = {}
    for row in RequestShares.objects.select_related("window"):
        for request_id, ns in zip(row.request_ids, row.device_ns, strict=True):
            per_request[(row.window.replica_id, row.window.start, request_id)] = ns
    rollups = Counter(
        tuple(row)
        for row in UsageRollup.objects.values_list(
            *(f.attname for f in UsageRollup._meta.concrete_fields if f.name != "id")
        )
    )
    load_hours = Counter(
        tuple(row)
        for row in ReplicaLoadHour.objects.values_list(
            *(f.attname for f in ReplicaLoadHour._meta.concrete_fields if f.name != "id")
        )
    )
    return {
        "windows": windows,
        "shares": shares,
        "per_request": per_request,
        "rollups": rollups,
        "load_hours": load_hours,
    }


def slo_snapshot(world, start, end) -> dict:
    """The SLO figures SLA credits read: every tenant by tier and day, and one tenant's."""
    return {
        "tier": slo_figures(start=start, end=end, tenant_ids=None, by_day=True, group="tier"),
        "one": slo_figures(start=start, end=end, tenant_ids=[world.tenants["b"].id], by_day=False),
    }


def price_books(world) -> None:
    """A list price in each tenant's currency (rating prices a tenant from
    a book in its own), and GPUs in service since long before."""
    Gpu.objects.update(in_service_date=date(2020, 1, 1))
    today = timezone.now().date()
    for back in range(3):  # the margin report sums both currencies in USD
        FxRate.objects.create(
            base="EUR", quote="USD", date=today - timedelta(days=back), rate=Decimal("1.08")
        )
    for currency, scale in (("USD", Decimal(1)), ("EUR", Decimal("0.92"))):
        make_list_price(
            world.model,
            effective_from=timezone.now() - YEAR,
            currency=currency,
            name=f"list {currency}",
            per_mtok=[Decimal(p) * scale for p in ("0.60", "0.15", "2.40")],
        )


def money_snapshot(world, start, end) -> dict:
    """What finance reads of the history: each tenant's draft invoice for
    every billing period it falls in (lines and totals, in its currency),
    the hours' allocated GPU cost, and a margin report over them."""
    invoices = {}
    for tenant in world.tenants.values():
        periods = {tenant_period(tenant=tenant, moment=m) for m in (start, end)}
        for period_start, period_end in sorted(periods):
            draft, _ = invoice_draft_build(
                tenant=tenant, period_start=period_start, period_end=period_end
            )
            lines = draft.lines.order_by("position").values_list(
                "kind", "description", "quantity", "unit_price", "amount", "amount_minor"
            )
            invoices[(tenant.slug, period_start)] = (
                draft.currency,
                draft.subtotal_minor,
                draft.total_minor,
                list(lines),
            )
    run = allocation_run_execute(
        run_id=allocation_run_create(start=hour_floor(start), end=hour_floor(end)).pk
    )
    assert run.status == "done", run.status
    allocated = sorted(
        CostAllocation.objects.values_list(
            "hour",
            "tenant_id",
            "pool_id",
            "served_model_id",
            "device_seconds",
            "capital",
            "energy",
            "other_opex",
            "idle",
            "total",
        )
    )
    report = margin_report_build(
        report_id=margin_report_request(
            kind=ReportKind.ADHOC, start=hour_floor(start), end=hour_floor(end)
        ).pk
    )
    return {"invoices": invoices, "allocated": allocated, "margins": report.tables}


def money_clear() -> None:
    Invoice.objects.filter(status="draft").delete()
    CostAllocation.objects.all().delete()
    MarginReport.objects.all().delete()
    AllocationRun.objects.all().delete()


def test_the_scaled_path_attributes_and_rolls_up_as_the_ledger_does_with_a_dask_worker_killed(
    world, nats_cluster, dask_cluster, tmp_path, settings
):
    now = timezone.now()
    start = hour_floor(now) - timedelta(hours=3)
    records = history_records(world, EVENTS, seed=61, start=start)
    later = now + timedelta(hours=2)  # every window closed past its grace

    # The ledger's path, the records in another order than the log's: the
    # two paths read them in different orders, as they would.
    shuffled = random.Random(5).sample(records, len(records))
    for i in range(0, EVENTS, 5000):
        usage_record_batch(
            events=[vars(r) for r in shuffled[i : i + 5000]], source=EventSource.GATEWAY
        )
    metering_run(now=later)
    ledger = attribution_snapshot()
    ledger_slo = slo_snapshot(world, start, later)
    price_books(world)
    ledger_money = money_snapshot(world, start, later)
    assert any(inv[2] > 0 for inv in ledger_money["invoices"].values()), ledger_money
    assert {inv[0] for inv in ledger_money["invoices"].values()} == {"USD", "EUR"}
    assert sum(row[-1] for row in ledger_money["allocated"]) > 0  # GPU cost, allocated
    assert ledger_money["margins"].get("tenant"), ledger_money["margins"]
    money_clear()
    assert any(row["failed"] for row in ledger_slo["tier"]), ledger_slo  # the queue's 429s
    assert len(ledger["windows"]) >= 4 and len(ledger["per_request"]) > EVENTS * 0.9
    assert all(w[-1] == "done" for w in ledger["windows"].values())
    ledger_truncate()

    # The scaled path: the log, a writer, the table, the Dask cluster.
    store_dir = tmp_path / "store"
    config = log_config(nats_cluster, store_dir)
    writer = start_writer(log_env(nats_cluster, store_dir), "w1", tmp_path)
    publisher = Publisher(config)
    try:
        wait_for_stream(config)
        for i in range(0, EVENTS, 500):
            publisher.publish(records[i : i + 500])
        store = RawStore(str(store_dir), stream=config.stream)
        wait_for(
            lambda: store.read(columns=["request_id"]).num_rows == EVENTS,
            timeout=120 + EVENTS / 2000,
            what="every event in the table",
        )
    finally:
        publisher.close()
        writer.stop()
    due = attribution_windows_due(now=later)
    assert len(due) == len(ledger["windows"])  # the writer marked the windows it filled

    from distributed import Client

    settings.USAGE_LOG = {
        **settings.USAGE_LOG,
        "URL": config.servers[0],
        "STORE_URL": str(store_dir),
        "DASK_SCHEDULER": dask_cluster.address,
    }
    with Client(dask_cluster.address) as client:
        holder = {}

        def kill_a_busy_worker():
            processing = client.processing()
            busy = [addr for addr, keys in processing.items() if keys]
            if not busy:
                return False
            names = {a: w["name"] for a, w in client.scheduler_info()["workers"].items()}
            holder["killed"] = (names[busy[0]], len(processing[busy[0]]))
            dask_cluster.kill_worker(int(names[busy[0]][1:]))
            return True

        killer = threading.Thread(
            target=wait_for,
            args=(kill_a_busy_worker,),
            kwargs={"timeout": 60, "what": "a busy worker", "every": 0.02},
        )
        killer.start()
        run = metering_run(now=later)  # the scheduled job, on the scaled path
        killer.join()
        assert holder["killed"][1] >= 1  # it held a task when it was killed
    assert run.windows == len(due) and run.still_pending == 0
    scaled = attribution_snapshot()
    assert scaled["windows"] == ledger["windows"]
    assert scaled["shares"] == ledger["shares"]
    assert scaled["per_request"] == ledger["per_request"]
    assert scaled["rollups"] == ledger["rollups"]
    assert scaled["load_hours"] == ledger["load_hours"]
    assert sum(r[6] for r in scaled["rollups"]) > 0  # tokens, not an empty match
    # SLA credits are judged by these: read from the store, the same figures.
    assert slo_snapshot(world, start, later) == ledger_slo
    # Invoices, allocated cost and margins read the rollups in PostgreSQL:
    # the same to the nano-unit.
    assert money_snapshot(world, start, later) == ledger_money
    assert len(scaled["load_hours"]) == len(ledger["windows"])
