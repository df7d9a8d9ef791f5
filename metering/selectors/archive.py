"""What the raw ledger keeps and what it archived: the retention horizon
(metering.retention) and every archived month (metering.archive), newest
first. Reads UsageArchive and the partition list, never the ledger itself."""

from __future__ import annotations

from datetime import datetime

from django.conf import settings

from metering.archive import archive_due
from metering.models import UsageArchive
from metering.retention import horizon_start, retention_months


def ledger_archives() -> list[UsageArchive]:
    return list(UsageArchive.objects.order_by("-month"))


def ledger_retention(*, now: datetime) -> dict:
    """The horizon, where archives go, and the months due for archiving now."""
    return {
        "months": retention_months(),
        "horizon": horizon_start(now),
        "archive_url": settings.METERING["ARCHIVE_URL"],
        "due": archive_due(now=now),
        "late_usage_periods": settings.BILLING["LATE_USAGE_PERIODS"],
    }
