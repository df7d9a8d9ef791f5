"""Hourly rollups for planning's tests: one tenant calling model `tiny`
on each named pool, an hour's tokens given by a function of the hour,
one request an hour each."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from metering.models import UsageRollup
from serving.models import Pool, ServedModel
from tests.factories import make_tenant


def weekday_weekend(weekday: int, weekend: int) -> Callable[[datetime], int]:
    return lambda hour: weekend if hour.weekday() >= 5 else weekday


def ledger_write(*, until: datetime, weeks: int, pools: dict[str, Callable[[datetime], int]]):
    """`weeks` of hours up to the hour `until` falls in (not included)."""
    tenant = make_tenant()
    model = ServedModel.objects.create(name="tiny")
    made = {name: Pool.objects.create(name=name, kind="shared") for name in pools}
    first = until.replace(minute=0, second=0, microsecond=0) - timedelta(weeks=weeks)
    UsageRollup.objects.bulk_create(
        UsageRollup(
            hour=first + timedelta(hours=h),
            tenant=tenant,
            pool=made[name],
            served_model=model,
            prompt_tokens=tokens(first + timedelta(hours=h)),
            requests_ok=1,
        )
        for h in range(weeks * 168)
        for name, tokens in pools.items()
    )
