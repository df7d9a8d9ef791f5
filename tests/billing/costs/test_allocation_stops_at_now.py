"""An allocation run stops at the current hour, through the API as through
the cost page's form (one rule: billing.costs.runs.allocation_period), and
a run leaves no hour booked past now, whoever booked it: a later, shorter
run removes the hours an earlier one booked ahead, idle cost of GPUs
deleted since included (issue 59, item 4)."""

from __future__ import annotations

from datetime import UTC, timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum
from django.utils import timezone

from billing import tasks
from billing.costs.runs import allocation_run_execute
from billing.models import AllocationRun, CostAllocation, PoolHourCost
from serving.models import Gpu, Replica
from tests.conftest import client_for_user
from tests.factories import make_finance_user


@pytest.fixture
def queued(monkeypatch):
    sent: list[int] = []
    monkeypatch.setattr(tasks.allocation_run_task, "delay", sent.append)
    return sent


@pytest.fixture
def finance(db):
    return client_for_user(make_finance_user())


@pytest.fixture
def fleet(world):
    """A shared pool busy this morning and a dedicated one, idle."""
    world.rate("energy", "0.10", "per_kwh")
    shared = world.pool("shared", policy="spread")
    replica = world.replica("r1", shared, [world.gpu("g1")])
    dedicated = world.pool("ded-b", kind="dedicated", owner=world.b)
    world.replica("r2", dedicated, [world.gpu("g2")])
    world.use(world.a, replica, 1800, hour=_now_hour() - timedelta(hours=2))
    world.dedicated = dedicated
    return world


def _now_hour():
    return timezone.now().astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _booked_after(moment) -> int:
    return (
        PoolHourCost.objects.filter(scenario=None, hour__gte=moment).count()
        + CostAllocation.objects.filter(scenario=None, hour__gte=moment).count()
    )


def _booked_ahead(world, *, end):
    """A run that booked hours to come, as runs did before they stopped at
    the current hour (written as it was: the rule is in allocation_period,
    which this bypasses)."""
    start = _now_hour().replace(hour=0)
    run = AllocationRun.objects.create(
        start=start, end=end, hours_total=int((end - start) / timedelta(hours=1))
    )
    allocation_run_execute(run_id=run.pk)
    assert _booked_after(_now_hour()) > 0  # what the later run must remove


def test_an_api_run_to_tomorrow_stops_at_the_current_hour(finance, fleet, queued):
    now_hour = _now_hour()
    today = now_hour.replace(hour=0)
    tomorrow = today + timedelta(days=2)

    response = finance.post(
        "/api/v1/costs/runs",
        {"start": today.isoformat(), "end": tomorrow.isoformat()},
        format="json",
    )

    assert response.status_code == 202, response.json()
    run = AllocationRun.objects.get(pk=response.json()["id"])
    assert (run.start, run.end, run.hours_total) == (today, now_hour, now_hour.hour)
    allocation_run_execute(run_id=run.pk)
    assert _booked_after(now_hour) == 0
    assert PoolHourCost.objects.filter(hour=now_hour - timedelta(hours=1)).exists()


def test_an_api_run_that_starts_at_the_current_hour_is_a_400_naming_start(finance, fleet, queued):
    now_hour = _now_hour()

    response = finance.post(
        "/api/v1/costs/runs",
        {"start": now_hour.isoformat(), "end": (now_hour + timedelta(hours=3)).isoformat()},
        format="json",
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["field"], error["message"]) == ("start", "start: must be before the current hour")
    assert not AllocationRun.objects.exists() and queued == []


def test_a_later_shorter_api_run_removes_the_hours_booked_ahead_for_gpus_deleted_since(
    finance, fleet, queued
):
    now_hour = _now_hour()
    today = now_hour.replace(hour=0)
    _booked_ahead(fleet, end=today + timedelta(days=2))
    ahead = PoolHourCost.objects.filter(pool=fleet.dedicated, hour__gte=now_hour)
    assert ahead.aggregate(cost=Sum("total"))["cost"] > 0  # its GPU's cost, booked ahead
    # The dedicated pool's GPU is deleted since.
    Replica.objects.filter(pool=fleet.dedicated).delete()
    Gpu.objects.filter(serial="g2").delete()

    response = finance.post(
        "/api/v1/costs/runs",
        {"start": today.isoformat(), "end": (today + timedelta(hours=1)).isoformat()},
        format="json",
    )
    assert response.status_code == 202, response.json()
    allocation_run_execute(run_id=response.json()["id"])

    assert _booked_after(now_hour) == 0
    # Nothing of the deleted GPU is left from the current hour on, where
    # its idle cost had been booked ahead.
    assert not PoolHourCost.objects.filter(pool=fleet.dedicated, hour__gte=now_hour).exists()
    assert not CostAllocation.objects.filter(pool=fleet.dedicated, hour__gte=now_hour).exists()
    left = PoolHourCost.objects.filter(hour__gte=now_hour).aggregate(cost=Sum("total"))
    assert (left["cost"] or Decimal(0)) == 0


def test_a_page_run_removes_the_hours_booked_ahead(
    client, fleet, queued, django_capture_on_commit_callbacks
):
    now_hour = _now_hour()
    today = now_hour.replace(hour=0)
    _booked_ahead(fleet, end=today + timedelta(days=1))
    client.force_login(make_finance_user())

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            "/costs/runs",
            {"first_day": f"{today:%Y-%m-%d}", "last_day": f"{today + timedelta(days=1):%Y-%m-%d}"},
        )

    assert response.status_code == 302
    run = AllocationRun.objects.order_by("-pk").first()
    assert (run.start, run.end) == (today, now_hour) and queued == [run.pk]
    allocation_run_execute(run_id=run.pk)
    assert _booked_after(now_hour) == 0
    assert PoolHourCost.objects.filter(hour=now_hour - timedelta(hours=1)).exists()
