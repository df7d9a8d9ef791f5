"""Who carries each pool-hour's cost: dedicated, reserved and shared pools,
both idle policies, exact conservation."""

from __future__ import annotations

from decimal import Decimal

from billing.models import CostAllocation, PoolHourCost

D = Decimal


def _rows(**filters):
    return {
        (r.tenant_id, r.served_model_id): r
        for r in CostAllocation.objects.filter(scenario=None, **filters)
    }


def test_a_dedicated_tenant_with_no_usage_carries_the_whole_cost(world):
    world.rate("energy", "0.10", "per_kwh")
    world.rate("pue", "1.5", "ratio")
    pool = world.pool("dedicated-a", kind="dedicated", owner=world.a)
    world.replica("ded-1", pool, [world.gpu("g1"), world.gpu("g2")])
    world.use(world.b, world.replica("shared-1", world.pool("shared"), [world.gpu("g3")]), 60)

    run = world.allocate()

    assert run.status == "done", run.error
    rows = _rows(pool=pool)
    # 2 GPUs x ($1 depreciation + 0.1 kW idle x 1.5 PUE x $0.10) = $2.03, all of it idle.
    assert list(rows) == [(world.a.pk, None)]
    row = rows[(world.a.pk, None)]
    assert (row.capital, row.energy, row.idle, row.total) == (0, 0, D("2.03"), D("2.03"))
    pool_hour = PoolHourCost.objects.get(pool=pool)
    assert (pool_hour.total, pool_hour.allocated, pool_hour.unallocated) == (
        D("2.03"),
        D("2.03"),
        0,
    )
    assert pool_hour.gpus == 2 and pool_hour.busy_seconds == 0


def test_shared_pool_with_the_platform_policy_leaves_idle_cost_unallocated(world):
    world.rate("energy", "0.10", "per_kwh")
    world.rate("pue", "1.5", "ratio")
    pool = world.pool("shared", policy="platform")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 1800)

    world.allocate()

    # Half busy: energy (100 + 300 x 0.5) W x 1.5 x $0.10/kWh = $0.0375; cost $1.0375.
    pool_hour = PoolHourCost.objects.get(pool=pool)
    assert pool_hour.total == D("1.0375")
    assert pool_hour.busy_seconds == 1800 and pool_hour.capacity_seconds == 3600
    row = _rows()[(world.a.pk, world.model.pk)]
    assert (row.capital, row.energy, row.idle) == (D("0.5"), D("0.01875"), 0)
    assert row.device_seconds == 1800
    assert pool_hour.allocated == D("0.51875") and pool_hour.unallocated == D("0.51875")
    assert world.b.pk not in {t for t, _ in _rows()}


def test_shared_pool_spreads_idle_cost_pro_rata_to_use(world):
    pool = world.pool("shared", policy="spread")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 1800)
    world.use(world.b, replica, 900)

    world.allocate()

    rows = _rows()
    a, b = rows[(world.a.pk, world.model.pk)], rows[(world.b.pk, world.model.pk)]
    assert (a.capital, b.capital) == (D("0.5"), D("0.25"))
    # The idle quarter ($0.25) goes 2:1, rounded to 1e-9 and exactly conserved.
    assert a.idle + b.idle == D("0.25")
    assert abs(a.idle - D("0.25") * 2 / 3) < D("1e-9")
    pool_hour = PoolHourCost.objects.get(pool=pool)
    assert pool_hour.unallocated == 0 and pool_hour.allocated == D("1")


def test_a_reservation_is_the_holders_and_its_overflow_is_shared_use(world):
    pool = world.pool("reserved-a", kind="reserved", owner=world.a, policy="platform")
    gpus = [world.gpu(f"g{i}") for i in range(4)]
    replica = world.replica("r1", pool, gpus)
    world.reserve(world.a, pool, 2)
    # Three GPU-hours of use against two reserved: one beyond the reservation.
    world.use(world.a, replica, 3 * 3600)

    world.allocate()

    row = _rows()[(world.a.pk, world.model.pk)]
    # $2 for the reserved GPUs (fully used) + $1 for the overflow on the rest.
    assert row.capital == D("3") and row.idle == 0
    pool_hour = PoolHourCost.objects.get(pool=pool)
    assert (pool_hour.total, pool_hour.unallocated) == (D("4"), D("1"))


def test_an_unused_reservation_is_still_the_holders_cost(world):
    pool = world.pool("reserved-a", kind="reserved", owner=world.a, policy="spread")
    world.replica("r1", pool, [world.gpu(f"g{i}") for i in range(4)])
    world.reserve(world.a, pool, 1)

    world.allocate()

    assert _rows()[(world.a.pk, None)].idle == D("1")
    assert PoolHourCost.objects.get(pool=pool).unallocated == D("3")


def test_a_gpu_no_replica_holds_is_platform_cost(world):
    world.gpu("spare")

    world.allocate()

    spare = PoolHourCost.objects.get(pool=None)
    assert (spare.gpus, spare.total, spare.unallocated) == (1, D("1"), D("1"))
    assert not CostAllocation.objects.exists()
