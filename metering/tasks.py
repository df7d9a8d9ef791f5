"""Celery tasks for metering: thin, safe to run twice."""

from celery import shared_task
from django.utils import timezone

from core.calendar import month_start, months_add
from metering.days import usage_days_repair
from metering.jobs import metering_run
from metering.partitions import usage_partitions_ensure_ahead
from metering.reconciliation import reconciliation_run_hour
from metering.windows import attribution_conservation_check


@shared_task(name="metering.run", time_limit=900, soft_time_limit=840, ignore_result=True)
def metering_run_task() -> int:
    """Every minute: attribute due windows, rebuild dirty hours."""
    return metering_run().windows


@shared_task(
    name="metering.partitions_ensure", time_limit=120, soft_time_limit=110, ignore_result=True
)
def usage_partitions_task() -> list[str]:
    """Daily: ledger partitions for last month to three months ahead."""
    return usage_partitions_ensure_ahead(now=timezone.now())


@shared_task(
    name="metering.conservation_check", time_limit=300, soft_time_limit=270, ignore_result=True
)
def conservation_check_task() -> int:
    """Hourly: windows whose attributed + idle != capacity (logged as errors)."""
    return len(attribution_conservation_check())


@shared_task(
    name="metering.usage_days_check", time_limit=900, soft_time_limit=840, ignore_result=True
)
def usage_days_check_task() -> int:
    """Daily, before the invoice run: the days of last month and this one
    (what invoices, late usage and budgets read) against their hours; a
    drifted day is logged as an error and rebuilt from its hours."""
    now = timezone.now()
    return len(usage_days_repair(start=months_add(month_start(now), -1), end=now))


@shared_task(name="metering.reconcile", time_limit=600, soft_time_limit=540, ignore_result=True)
def reconcile_task() -> int:
    """Hourly: the previous hour of every replica against vLLM's counters."""
    from datetime import timedelta

    return len(reconciliation_run_hour(hour=timezone.now() - timedelta(hours=1)))


@shared_task(
    name="metering.store_maintain",
    time_limit=3 * 3600,
    soft_time_limit=3 * 3600 - 60,
    ignore_result=True,
)
def store_maintain_task() -> int:
    """Hourly, on the scaled path: the raw-event store's closed hours
    compacted, its unreferenced files vacuumed (metering.log.maintenance);
    returns the hours compacted. Nothing on the ledger's path."""
    from django.conf import settings

    if not settings.USAGE_LOG["URL"]:
        return 0
    from metering.log.maintenance import store_maintain

    return len(store_maintain().compacted)


@shared_task(name="metering.ledger_archive", time_limit=6 * 3600, ignore_result=True)
def ledger_archive_task() -> int:
    """Monthly: the raw ledger's months past the retention horizon archived
    to Parquet and dropped (metering.archive); returns the months done."""
    from metering.archive import ledger_archive

    return len(ledger_archive(now=timezone.now()))
