"""What a GPU-hour costs: depreciation that stops at end of life, leases,
energy by busy fraction and time of day, overheads, dated rate changes."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from hypothesis import given, settings
from hypothesis import strategies as st

from billing.costs.cost_model import FleetArrays, RateArrays, gpu_hour_costs
from billing.models import CostRate, PoolHourCost

D = Decimal


def test_depreciation_stops_at_end_of_life_and_flags_the_gpu(world):
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("old", in_service=date(2025, 1, 1))])
    start = datetime(2025, 12, 31, 22, tzinfo=UTC)

    world.allocate(start=start, end=start + timedelta(hours=4))

    rows = PoolHourCost.objects.filter(pool=pool).order_by("hour")
    assert [r.capital for r in rows] == [D(1), D(1), 0, 0]
    assert [r.fully_depreciated_gpus for r in rows] == [0, 0, 1, 1]


def test_not_in_service_yet_costs_nothing(world):
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("new", in_service=date(2026, 11, 1))])
    world.rate("colocation", "720", "per_gpu_month")
    world.allocate()
    assert not PoolHourCost.objects.exists()


@given(
    capex=st.integers(min_value=1, max_value=10**7),
    salvage_share=st.floats(min_value=0, max_value=1),
    months=st.integers(min_value=1, max_value=120),
)
@settings(max_examples=60, deadline=None)
def test_a_whole_life_of_hours_adds_up_to_capex_less_salvage_exactly(capex, salvage_share, months):
    life = months * 730
    depreciable = capex * 10**9 - int(capex * 10**9 * salvage_share)
    fleet = FleetArrays(
        scope=np.array([0]),
        in_service=np.array([0]),
        life_hours=np.array([life]),
        depreciable_nano=np.array([depreciable]),
        lease_nano_per_hour=np.array([0]),
        idle_watts=np.array([0]),
        busy_watts=np.array([0]),
    )
    hours = np.arange(0, (life + 5) * 3600, 3600, dtype=np.int64)
    zeros = np.zeros((1, len(hours)))
    costs = gpu_hour_costs(
        fleet=fleet,
        rates=RateArrays(zeros, zeros + 1, zeros, zeros),
        hours=hours,
        busy_fraction=zeros,
    )
    capital = costs.capital[0]
    assert int(capital.sum()) == depreciable
    assert capital.max() - capital[:life].min() <= 1  # straight line, to one nano-unit
    assert not capital[life:].any() and costs.fully_depreciated[0, life:].all()


def test_a_leased_gpu_costs_its_lease_rate(world):
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("leased", lease_rate_per_hour=D("2.5"))])
    world.allocate()
    assert PoolHourCost.objects.get(pool=pool).capital == D("2.5")


def test_energy_follows_busy_fraction_pue_and_time_of_day_tariff(world):
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    # A day-of-tariffs is rows that partition the day: 13:00-14:00 UTC is peak.
    world.rate("energy", "0.10", "per_kwh", hour_from=0, hour_to=13)
    world.rate("energy", "0.30", "per_kwh", hour_from=13, hour_to=14)
    world.rate("energy", "0.10", "per_kwh", hour_from=14, hour_to=24)
    world.rate("pue", "1.2", "ratio")
    start = datetime(2026, 10, 5, 12, tzinfo=UTC)
    world.use(world.a, replica, 3600, hour=start)  # busy all of 12:00
    world.use(world.a, replica, 3600, hour=start + timedelta(hours=1))  # and of 13:00

    world.allocate(start=start, end=start + timedelta(hours=3))

    energy = [r.energy for r in PoolHourCost.objects.filter(pool=pool).order_by("hour")]
    # 0.4 kW x 1.2 x $0.10; 0.4 kW x 1.2 x $0.30 (peak hour); idle 0.1 kW x 1.2 x $0.10.
    assert energy == [D("0.048"), D("0.144"), D("0.012")]


def test_overheads_per_gpu_month_and_per_kw_month(world):
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("g1")])
    world.rate("colocation", "744", "per_gpu_month")  # October has 744 hours
    world.rate("network", "186", "per_kw_month")  # 0.4 kW busy nameplate -> $74.4/month
    world.rate("staff", "0.05", "per_gpu_hour")
    world.allocate()
    assert PoolHourCost.objects.get(pool=pool).other_opex == D("1") + D("0.1") + D("0.05")


def test_a_rate_change_mid_month_applies_from_its_date(world):
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("g1")])
    world.rate("energy", "0.10", "per_kwh", effective_from=datetime(2026, 10, 1, tzinfo=UTC))
    world.rate("energy", "0.20", "per_kwh", effective_from=datetime(2026, 10, 15, tzinfo=UTC))

    world.allocate(start=datetime(2026, 10, 1, tzinfo=UTC), end=datetime(2026, 11, 1, tzinfo=UTC))

    first, _ = CostRate.objects.order_by("effective_from")
    assert first.effective_to == datetime(2026, 10, 15, tzinfo=UTC)  # closed by the change
    energy = dict(PoolHourCost.objects.filter(pool=pool).values_list("hour", "energy"))
    assert energy[datetime(2026, 10, 14, 23, tzinfo=UTC)] == D("0.01")  # 0.1 kW idle x $0.10
    assert energy[datetime(2026, 10, 15, 0, tzinfo=UTC)] == D("0.02")
    assert sum(energy.values()) == D("0.01") * 14 * 24 + D("0.02") * 17 * 24


def test_rerunning_a_period_gives_identical_rows(world):
    pool = world.pool("shared")
    replica = world.replica("r1", pool, [world.gpu("g1"), world.gpu("g2")])
    world.rate("energy", "0.137", "per_kwh")
    world.use(world.a, replica, 1234.5)
    world.use(world.b, replica, 777.25)

    def snapshot():
        from billing.models import CostAllocation

        return sorted(
            CostAllocation.objects.values_list(
                "hour",
                "tenant",
                "pool",
                "served_model",
                "device_seconds",
                "capital",
                "energy",
                "other_opex",
                "idle",
                "total",
            )
        ), sorted(PoolHourCost.objects.values_list("hour", "pool", "total", "unallocated"))

    world.allocate()
    before = snapshot()
    world.allocate()
    assert snapshot() == before and len(before[0]) == 2


def test_rate_input_errors_name_the_field(world):
    world.rate("energy", "0.10", "per_kwh", effective_to=datetime(2026, 6, 1, tzinfo=UTC))
    cases = [
        ({"component": "energy", "basis": "per_kwh", "amount": "-1"}, "amount"),
        ({"component": "pue", "basis": "ratio", "amount": "0.9"}, "amount"),
        ({"component": "energy", "basis": "per_gpu_month", "amount": "1"}, "basis"),
        (
            {"component": "staff", "basis": "per_gpu_hour", "amount": "1", "hour_from": 3},
            "hour_from",
        ),
        ({"component": "energy", "basis": "per_kwh", "amount": "1"}, "effective_from"),  # overlap
    ]
    for fields, field in cases:
        with pytest.raises(ValidationError) as err:
            world.rate(fields.pop("component"), fields.pop("amount"), fields.pop("basis"), **fields)
        assert field in err.value.message_dict, (fields, err.value)
    assert CostRate.objects.count() == 1


def test_the_demo_rates_seed_once_and_price_a_whole_day(world):
    from demo.seeds.billing import DEMO_RATES, cost_rates_demo_seed
    from demo.seeds.fleet import grid_intensity_demo_seed

    assert cost_rates_demo_seed() == len(DEMO_RATES)
    assert cost_rates_demo_seed() == 0
    assert grid_intensity_demo_seed() == 4 and grid_intensity_demo_seed() == 0
    world.node.site = "demo-dc"
    world.node.save()
    pool = world.pool("shared")
    world.replica("r1", pool, [world.gpu("g1")])
    start = datetime(2026, 10, 5, tzinfo=UTC)
    run = world.allocate(start=start, end=start + timedelta(days=1))
    assert run.warnings == []  # every hour has a tariff, a PUE and a grid intensity
