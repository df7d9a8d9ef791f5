"""A day's usage totals (UsageDay) are kept by the database from the hourly
rollups, whoever writes them: the rollup job from the ledger, an ORM row,
an upsert, an UPDATE that moves a row to another day, a DELETE. Rating
reads a period's whole days from them and the hours around its edges
from the rollups: the sums must be those of the hours, to the token and
the nanosecond, for any edges."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from core.calendar import day_start, month_start, months_add
from metering.choices import EventSource
from metering.days import DayDrift, usage_days_check, usage_days_repair
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.models import UsageDay, UsageRollup
from metering.selectors.rating import usage_by_stretch
from metering.tasks import usage_days_check_task
from serving.services import served_model_ensure
from serving.tiny_model import model_config
from tests.metering.conftest import T0

DAY0 = datetime(2026, 10, 4, tzinfo=UTC)
TOKYO = timezone(timedelta(hours=9))


def days_of_hours() -> dict[tuple, list]:
    """What the days must hold: the hourly rollups with a model, summed."""
    out: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, Decimal(0), 0])
    for r in UsageRollup.objects.exclude(served_model=None):
        sums = out[(day_start(r.hour), r.tenant_id, r.served_model_id)]
        for n, value in enumerate(
            (r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.device_seconds, 1)
        ):
            sums[n] += value
    return dict(out)


def days() -> dict[tuple, list]:
    return {
        (d.day, d.tenant_id, d.served_model_id): [
            d.prompt_tokens,
            d.cached_tokens,
            d.completion_tokens,
            d.device_seconds,
            d.rollup_rows,
        ]
        for d in UsageDay.objects.all()
    }


def rollup(ledger, hour, *, tenant=None, model=None, priority=0, **sums) -> UsageRollup:
    return UsageRollup.objects.create(
        hour=hour,
        tenant=tenant or ledger.a,
        served_model=model if model is not None else ledger.model,
        pool=ledger.pool,
        replica=ledger.replica,
        priority=priority,
        **sums,
    )


def test_days_follow_every_write_of_the_hours(ledger):
    other = served_model_ensure(name="other-model", config=model_config())
    rollup(ledger, DAY0 + timedelta(hours=1), prompt_tokens=10, device_seconds=Decimal("1.5"))
    rollup(ledger, DAY0 + timedelta(hours=23), prompt_tokens=5, completion_tokens=7)
    moved = rollup(ledger, DAY0 + timedelta(hours=2), tenant=ledger.b, cached_tokens=3)
    rollup(ledger, DAY0 + timedelta(days=1), model=other, completion_tokens=4)
    # A rollup without a model (a rejected request's) is never rated.
    UsageRollup.objects.create(hour=DAY0, tenant=ledger.a, requests_rejected=1)
    assert days() == days_of_hours()
    assert days()[(DAY0, ledger.a.pk, ledger.model.pk)] == [15, 0, 7, Decimal("1.5"), 2]
    assert UsageDay.objects.count() == 3

    # An UPDATE changing sums, one moving a row to the next day, an upsert.
    UsageRollup.objects.filter(hour=DAY0 + timedelta(hours=1)).update(prompt_tokens=11)
    UsageRollup.objects.filter(pk=moved.pk).update(hour=DAY0 + timedelta(days=1, hours=2))
    UsageRollup.objects.bulk_create(
        [
            UsageRollup(
                hour=DAY0 + timedelta(hours=23),
                tenant=ledger.a,
                served_model=ledger.model,
                pool=ledger.pool,
                replica=ledger.replica,
                prompt_tokens=50,
                completion_tokens=70,
            ),
            UsageRollup(hour=DAY0 + timedelta(hours=3), tenant=ledger.a, served_model=other),
        ],
        update_conflicts=True,
        unique_fields=["hour", "tenant", "served_model", "pool", "replica", "priority"],
        update_fields=["prompt_tokens", "completion_tokens"],
    )
    assert days() == days_of_hours()
    assert days()[(DAY0, ledger.a.pk, ledger.model.pk)] == [61, 0, 70, Decimal("1.5"), 2]
    assert (DAY0, ledger.b.pk, ledger.model.pk) not in days()  # moved away whole

    # An UPDATE moving a row to another tenant and model, one taking its
    # model away (no longer rated) and one giving a model to a row without.
    UsageRollup.objects.filter(hour=DAY0 + timedelta(hours=23)).update(
        tenant=ledger.b, served_model=other
    )
    UsageRollup.objects.filter(hour=DAY0 + timedelta(hours=1)).update(served_model=None)
    UsageRollup.objects.filter(hour=DAY0, served_model=None).update(served_model=other)
    assert days() == days_of_hours()
    assert (DAY0, ledger.a.pk, ledger.model.pk) not in days()
    assert days()[(DAY0, ledger.b.pk, other.pk)] == [50, 0, 70, Decimal(0), 1]

    # A DELETE of part of a day leaves the rest of it.
    UsageRollup.objects.filter(hour=DAY0, served_model=other).delete()
    assert days() == days_of_hours()
    assert days()[(DAY0, ledger.a.pk, other.pk)][4] == 1  # hour 3's row is left

    # A day whose last hour goes is gone too; the others stay.
    UsageRollup.objects.filter(hour__gte=DAY0 + timedelta(days=1)).delete()
    assert days() == days_of_hours()
    assert sorted({day for day, _, _ in days()}) == [DAY0]


def test_days_equal_hours_after_the_metering_job(ledger):
    """Usage recorded through the service, rolled up by the job, then late
    usage for the same hours rolled up again (each hour rebuilt whole:
    deleted and inserted)."""
    batch = [
        ledger.event(f"d-{n}", tenant=(ledger.a, ledger.b)[n % 2], at=T0 + timedelta(hours=n * 7))
        for n in range(12)
    ]
    usage_record_batch(events=batch, source=EventSource.API)
    metering_run(now=T0 + timedelta(days=5))
    assert days() == days_of_hours()
    assert sum(d[0] for d in days().values()) == 12 * 20

    late = [ledger.event(f"late-{n}", at=T0 + timedelta(hours=n * 7)) for n in range(0, 12, 3)]
    usage_record_batch(events=late, source=EventSource.API)
    metering_run(now=T0 + timedelta(days=5))
    assert days() == days_of_hours()
    assert sum(d[0] for d in days().values()) == 16 * 20


def stretch_sums_of_hours(start, end, edges, tenant_ids) -> list[tuple]:
    """usage_by_stretch's rows as the hourly rollups alone give them."""
    out: dict[tuple, list] = defaultdict(lambda: [0, 0, 0, Decimal(0), 0])
    rollups = UsageRollup.objects.filter(hour__gte=start, hour__lt=end).exclude(served_model=None)
    for r in rollups:
        if tenant_ids is not None and r.tenant_id not in tenant_ids:
            continue
        segment = sum(1 for edge in edges[1:] if r.hour >= edge)
        sums = out[(r.tenant_id, segment, r.served_model_id)]
        for n, value in enumerate(
            (r.prompt_tokens, r.cached_tokens, r.completion_tokens, r.device_seconds, 1)
        ):
            sums[n] += value
    return [(*key, *out[key]) for key in sorted(out)]


@pytest.mark.parametrize(
    ("start", "end", "edges"),
    [
        # A month-like period of whole days, one stretch.
        (DAY0, DAY0 + timedelta(days=4), [DAY0]),
        # Prices changing mid-day and at a midnight.
        (
            DAY0,
            DAY0 + timedelta(days=4),
            [DAY0, DAY0 + timedelta(days=1, hours=7), DAY0 + timedelta(days=3)],
        ),
        # A period starting and ending mid-day (no whole day in the first stretch).
        (
            DAY0 + timedelta(hours=13),
            DAY0 + timedelta(days=3, hours=5),
            [DAY0 + timedelta(hours=13), DAY0 + timedelta(hours=20)],
        ),
        # Less than a day.
        (DAY0 + timedelta(hours=2), DAY0 + timedelta(hours=9), [DAY0 + timedelta(hours=2)]),
        # Moments in another zone, not on the hour; edges before the start
        # and after the end.
        (
            (DAY0 + timedelta(hours=4, minutes=30)).astimezone(TOKYO),
            (DAY0 + timedelta(days=3, hours=1, minutes=5)).astimezone(TOKYO),
            [
                DAY0 - timedelta(days=1),
                (DAY0 + timedelta(days=1, hours=9, minutes=10)).astimezone(TOKYO),
                DAY0 + timedelta(days=5),
            ],
        ),
    ],
)
def test_stretches_sum_what_the_hours_sum(ledger, start, end, edges):
    other = served_model_ensure(name="other-model", config=model_config())
    rng = random.Random(5)
    hour = DAY0 - timedelta(hours=3)
    while hour < DAY0 + timedelta(days=4, hours=3):
        for tenant in (ledger.a, ledger.b):
            for model in (ledger.model, other):
                rollup(
                    ledger,
                    hour,
                    tenant=tenant,
                    model=model,
                    prompt_tokens=rng.randint(0, 5000),
                    cached_tokens=rng.randint(0, 100),
                    completion_tokens=rng.randint(0, 900),
                    device_seconds=Decimal(rng.randint(0, 10**12)).scaleb(-9),
                )
        hour += timedelta(hours=rng.choice([1, 1, 2, 5]))
    for tenant_ids in (None, [ledger.b.pk]):
        got = usage_by_stretch(start=start, end=end, edges=edges, tenant_ids=tenant_ids)
        assert got == stretch_sums_of_hours(start, end, edges, tenant_ids)
        assert got  # the data reaches every case


def test_stretches_need_their_edges_sorted(ledger):
    edges = [DAY0 + timedelta(days=2), DAY0 + timedelta(days=1)]
    with pytest.raises(ValueError, match="sorted"):
        usage_by_stretch(start=DAY0, end=DAY0 + timedelta(days=3), edges=edges, tenant_ids=None)


def test_a_truncate_of_the_hours_empties_the_days(ledger):
    rollup(ledger, DAY0, prompt_tokens=1)
    with connection.cursor() as cursor:
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the rows' checks done: as if committed
        cursor.execute("TRUNCATE metering_usagerollup")
    assert not UsageDay.objects.exists()


def _drift_days(ledger) -> tuple[datetime, datetime]:
    """Three ways around the triggers: an hour written with them disabled
    (a bulk load under session_replication_role = replica), a day edited by
    hand, a day left with no hours. Returns the days touched."""
    rollup(ledger, DAY0 + timedelta(hours=3), prompt_tokens=10, device_seconds=Decimal("2.5"))
    rollup(ledger, DAY0 + timedelta(days=1), tenant=ledger.b, completion_tokens=4)
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")  # no trigger fires
        rollup(ledger, DAY0 + timedelta(hours=5), prompt_tokens=7, cached_tokens=2)
        cursor.execute("SET session_replication_role = origin")
        cursor.execute(
            "UPDATE metering_usageday SET completion_tokens = 5 WHERE tenant_id = %s", [ledger.b.pk]
        )
    UsageDay.objects.create(
        day=DAY0 + timedelta(days=2), tenant=ledger.a, served_model=ledger.model, prompt_tokens=3,
        rollup_rows=1,
    )  # fmt: skip
    return DAY0, DAY0 + timedelta(days=3)


def test_a_check_finds_every_day_that_differs_from_its_hours_and_a_repair_rebuilds_it(
    ledger, caplog
):
    start, end = _drift_days(ledger)
    a, b, model = ledger.a.pk, ledger.b.pk, ledger.model.pk
    expected = [
        DayDrift(DAY0, a, model, (10, 0, 0, Decimal("2.5"), 1), (17, 2, 0, Decimal("2.5"), 2)),
        DayDrift(DAY0 + timedelta(days=1), b, model, (0, 0, 5, 0, 1), (0, 0, 4, 0, 1)),
        DayDrift(DAY0 + timedelta(days=2), a, model, (3, 0, 0, 0, 1), None),
    ]
    # Mid-day edges take in their whole days.
    assert usage_days_check(start=start + timedelta(hours=12), end=end - timedelta(hours=1)) == (
        expected
    )
    assert usage_days_check(start=start + timedelta(days=1), end=end) == expected[1:]
    assert days() != days_of_hours()

    assert usage_days_repair(start=start, end=end) == expected
    assert days() == days_of_hours()
    assert days()[(DAY0, a, model)] == [17, 2, 0, Decimal("2.5"), 2]
    assert not UsageDay.objects.filter(day=DAY0 + timedelta(days=2)).exists()
    assert usage_days_check(start=start, end=end) == []
    assert sum("drifted from its hours" in r.message for r in caplog.records) == 3
    assert usage_days_repair(start=start, end=end) == []  # nothing left: nothing written


def test_usage_days_command_reports_drift_and_repairs_only_when_asked(ledger):
    _drift_days(ledger)
    held = days()
    out = StringIO()
    with pytest.raises(CommandError, match="--repair"):
        call_command("usage_days", "--since", "2026-10-01", "--until", "2026-12-01", stdout=out)
    assert "3 drifted days in 2 months, left as they are" in out.getvalue()
    assert "2026-10-05 tenant" in out.getvalue()
    assert days() == held

    out = StringIO()
    call_command("usage_days", "--repair", stdout=out)  # from the first rollup to now
    assert "3 drifted days in" in out.getvalue()
    assert days() == days_of_hours()
    call_command("usage_days", stdout=StringIO())  # clean: no error


def test_the_daily_job_repairs_last_months_days(ledger, caplog):
    now = datetime.now(UTC)
    last_month = months_add(month_start(now), -1)
    rollup(ledger, last_month + timedelta(hours=1), prompt_tokens=4)
    rollup(ledger, months_add(last_month, -1), prompt_tokens=9)  # older: not the job's
    UsageDay.objects.all().update(prompt_tokens=1)
    assert usage_days_check_task() == 1
    assert days()[(last_month, ledger.a.pk, ledger.model.pk)][0] == 4
    assert days()[(months_add(last_month, -1), ledger.a.pk, ledger.model.pk)][0] == 1
    assert "drifted from its hours" in caplog.text
