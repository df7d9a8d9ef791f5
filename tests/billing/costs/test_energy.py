"""Energy and emissions per tenant, model and pool, hour by hour, as the
booked allocation computes them; worked by hand. The rows of an hour add
up to the fleet's energy in it: the tenants' plus the idle."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Sum

from metering.models import EnergyHour
from serving.models import GridIntensity
from tests.billing.conftest import H0


def rows(hour):
    return {
        (r.tenant_id, r.served_model_id, r.pool_id): (r.kwh, r.co2e_g)
        for r in EnergyHour.objects.filter(hour=hour)
    }


def test_an_hours_energy_is_its_users_busy_draw_and_its_idle_draw_adding_up(world):
    """T-100: 100 W idle, 400 W busy; PUE 1.5. r1 holds g1; g2 is spare.
    At H0 Alpha used r1 1,800 s and Bravo 900 s: busy 0.75 of the hour.
    g1: busy 0.4 kW x 0.75 x 1.5 = 0.45 kWh, Alpha 2/3 of it (0.3) and
    Bravo 1/3 (0.15); idle 0.1 x 0.25 x 1.5 = 0.0375 kWh, the pool's.
    g2: idle all hour, 0.15 kWh, no pool's. The fleet: 0.6375 kWh.
    The lab's grid: 200 g/kWh at H0 (its own figure), 400 the year's
    average (the hour after)."""
    pool = world.pool("shared")
    g1 = world.gpu("g1")
    world.gpu("g2")
    r1 = world.replica("r1", pool, [g1])
    world.rate("pue", "1.5", "ratio")
    GridIntensity.objects.create(
        site="lab", period="year", start=datetime(2026, 1, 1, tzinfo=UTC), g_per_kwh=400
    )
    GridIntensity.objects.create(site="lab", period="hour", start=H0, g_per_kwh=200)
    world.use(world.a, r1, 1800)
    world.use(world.b, r1, 900)

    run = world.allocate(end=H0 + timedelta(hours=2))

    assert run.status == "done" and not [w for w in run.warnings if "intensity" in w]
    model = world.model.pk
    assert rows(H0) == {
        (world.a.pk, model, pool.pk): (Decimal("0.300000"), Decimal("60.000")),
        (world.b.pk, model, pool.pk): (Decimal("0.150000"), Decimal("30.000")),
        (None, None, pool.pk): (Decimal("0.037500"), Decimal("7.500")),
        (None, None, None): (Decimal("0.150000"), Decimal("30.000")),
    }
    fleet = EnergyHour.objects.filter(hour=H0).aggregate(kwh=Sum("kwh"), g=Sum("co2e_g"))
    assert (fleet["kwh"], fleet["g"]) == (Decimal("0.637500"), Decimal("127.500"))
    # The hour after, nobody busy: 0.15 kWh each, at the year's 400 g/kWh.
    assert rows(H0 + timedelta(hours=1)) == {
        (None, None, pool.pk): (Decimal("0.150000"), Decimal("60.000")),
        (None, None, None): (Decimal("0.150000"), Decimal("60.000")),
    }

    # Again: the same rows, not twice.
    world.allocate(end=H0 + timedelta(hours=2))
    assert EnergyHour.objects.count() == 6


def test_a_site_without_a_grid_intensity_is_named_and_counts_no_emissions(world):
    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, r1, 3600)
    run = world.allocate()
    assert "no grid intensity (no emissions counted) at: 'lab'" in run.warnings
    (row,) = EnergyHour.objects.filter(tenant=world.a)
    assert row.kwh == Decimal("0.400000") and row.co2e_g == 0  # no PUE: 1.0


def test_a_scenarios_allocation_writes_no_energy(world):
    from billing.models import CostScenario

    pool = world.pool("shared")
    r1 = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, r1, 3600)
    scenario = CostScenario.objects.create(
        name="cheaper power", start=H0, end=H0 + timedelta(hours=1)
    )
    world.allocate(scenario=scenario)
    assert not EnergyHour.objects.exists()
