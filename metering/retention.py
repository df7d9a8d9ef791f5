"""How long the raw ledger keeps its events: the retention horizon.

Events received before the horizon's start (the first of the month
RETENTION_MONTHS before this one) are archived to Parquet and dropped from
the database (metering.archive), their idempotency keys with them. So the
horizon is also the ledger's idempotency horizon: an event older than it
is refused at ingest (400 naming `ended_at`), since it could no longer be
told from one recorded before. Hourly and daily rollups, invoices and the
archives' own record are kept forever.

The horizon may not be shorter than the longest open billing period (a
calendar month: what has not been invoiced yet) plus the late-usage window
(the invoiced periods each new invoice rates again: BILLING
LATE_USAGE_PERIODS): both still read the raw ledger."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from core.calendar import month_start, months_add

BILLING_PERIOD_MONTHS = 1  # invoices are per calendar month


class RetentionTooShort(ValueError):
    """A horizon that would archive usage billing still reads."""


def retention_months_minimum() -> int:
    return BILLING_PERIOD_MONTHS + settings.BILLING["LATE_USAGE_PERIODS"]


def retention_check(months: int, *, name: str = "METERING_RETENTION_MONTHS") -> int:
    """`months`, or RetentionTooShort naming `name` and both bounds."""
    late = settings.BILLING["LATE_USAGE_PERIODS"]
    least = retention_months_minimum()
    if months < least:
        raise RetentionTooShort(
            f"{name}={months} is shorter than the longest open billing period "
            f"({BILLING_PERIOD_MONTHS} month) plus the late-usage window "
            f"(BILLING_LATE_USAGE_PERIODS={late} invoiced months): at least {least}"
        )
    return months


def retention_months() -> int:
    """The configured horizon, checked."""
    return retention_check(settings.METERING["RETENTION_MONTHS"])


def archived_before() -> datetime | None:
    """The end of the newest month archived and dropped (None: none yet):
    the raw ledger holds nothing before it, so nothing before it may be
    rebuilt from the raw ledger."""
    from metering.models import UsageArchive

    last = (
        UsageArchive.objects.filter(dropped_at__isnull=False)
        .order_by("-month")
        .values_list("month", flat=True)
        .first()
    )
    return months_add(last, 1) if last is not None else None


def horizon_start(now: datetime, *, months: int | None = None) -> datetime:
    """The first moment the ledger keeps: events received before it are
    archived, and refused at ingest."""
    months = retention_months() if months is None else months
    return months_add(month_start(now), -months)
