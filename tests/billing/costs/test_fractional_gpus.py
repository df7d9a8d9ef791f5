"""Hours worked by hand for GPUs a replica holds part of: a MIG
instance carries its GPU's cost by its compute fraction, unheld slices are
idle cost of the pool, a time-sliced GPU's cost is its pool's, shared by
use; every GPU's pieces add up to exactly its whole cost."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from billing.costs.gpu_days import gpu_day_costs
from billing.models import CostAllocation, PoolHourCost
from serving.gpu_shares import Share
from serving.services import replica_gpu_shares_set
from tests.billing.conftest import H0, World, make_world

D = Decimal
NANO = D("1e-9")


def _mig(world: World, name, pool, gpu, profile, instance):
    replica = world.replica(name, pool, [])
    replica_gpu_shares_set(
        replica=replica,
        shares=[Share(gpu_id=gpu.pk, sharing="mig", mig_profile=profile, mig_instance=instance)],
    )
    return replica


def _sliced(world: World, name, pool, gpu, percent):
    replica = world.replica(name, pool, [])
    replica_gpu_shares_set(
        replica=replica,
        shares=[Share(gpu_id=gpu.pk, sharing="time_sliced", share_percent=percent)],
    )
    return replica


def test_a_mig_partitioned_gpu_with_an_unused_slice(world):
    """An A100 80GB at $1 an hour (no energy or opex rates): a 3g.40gb
    instance in a shared pool, a 2g.20gb instance in Bravo's dedicated
    pool, 2 of 7 compute slices held by nobody."""
    world.sku.mig_capable = True
    world.sku.save()
    gpu = world.gpu("a100")
    shared = world.pool("shared", policy="platform")
    dedicated = world.pool("ded-b", kind="dedicated", owner=world.b)
    three = _mig(world, "r3g", shared, gpu, "3g.40gb", 1)
    _mig(world, "r2g", dedicated, gpu, "2g.20gb", 2)
    world.use(world.a, three, 1000)  # of its 3/7 x 3,600 = 1,542.857 s

    run = world.allocate()
    assert run.status == "done", run.error

    shared_hour = PoolHourCost.objects.get(pool=shared)
    dedicated_hour = PoolHourCost.objects.get(pool=dedicated)
    # 3/7 of $1 for the instance (rounded down to the nano) and the unheld
    # 2/7 (its GPU's last piece: what is left) in the shared pool; 2/7 of
    # $1 (rounded down) in the dedicated one. Together: $1 exactly.
    assert shared_hour.capital == D("0.428571428") + D("0.285714287")
    assert dedicated_hour.capital == D("0.285714285")
    assert shared_hour.total + dedicated_hour.total == 1
    # Capacity: 5/7 and 2/7 of the hour; each pool counts the GPU once.
    assert abs(shared_hour.capacity_seconds - D(3600 * 5) / 7) < D("0.001")
    assert abs(dedicated_hour.capacity_seconds - D(3600 * 2) / 7) < D("0.001")
    assert shared_hour.gpus == dedicated_hour.gpus == 1
    # Alpha used 1,000 of the shared pool's 2,571.43 s: that share of its
    # $0.714285715; the idle rest stays the platform's (its policy).
    alpha = CostAllocation.objects.get(tenant=world.a)
    expected = D("0.714285715") * 1000 / (D(3600 * 5) / 7)
    assert abs(alpha.total - expected) <= 2 * NANO
    assert shared_hour.allocated == alpha.total
    assert shared_hour.unallocated == shared_hour.total - alpha.total
    # Bravo's dedicated instance is all Bravo's, unused.
    bravo = CostAllocation.objects.get(tenant=world.b)
    assert (bravo.idle, bravo.total) == (D("0.285714285"), D("0.285714285"))
    # The fleet's FOCUS rows: the GPU once per pool it is in, for its hour.
    days = {d.pool_id: d for d in gpu_day_costs(start=H0, end=H0 + timedelta(hours=1))}
    assert set(days) == {shared.pk, dedicated.pk}
    assert days[shared.pk].costs["capital"] == D("0.714285715")
    assert days[dedicated.pk].costs["capital"] == D("0.285714285")
    assert {d.hours for d in days.values()} == {1}


def test_a_time_sliced_gpu_with_two_replicas(world):
    """One $1/h GPU time-sliced 60/40 between two replicas of a shared pool
    (idle spread): Alpha busy 1,080 s on the first, Bravo 720 s on the
    second. The GPU's cost is the pool's: half of it busy, shared 3:2 by
    use, and the idle half spread 3:2 too."""
    gpu = world.gpu("g1")
    pool = world.pool("shared", policy="spread")
    first = _sliced(world, "r60", pool, gpu, 60)
    second = _sliced(world, "r40", pool, gpu, 40)
    world.use(world.a, first, 1080)
    world.use(world.b, second, 720)

    world.allocate()

    hour = PoolHourCost.objects.get(pool=pool)
    assert (hour.capital, hour.gpus, hour.capacity_seconds, hour.busy_seconds) == (
        1,
        1,
        3600,
        1800,
    )
    rows = {r.tenant_id: r for r in CostAllocation.objects.filter(pool=pool)}
    assert rows[world.a.pk].capital == D("0.30") and rows[world.b.pk].capital == D("0.20")
    assert rows[world.a.pk].total == D("0.60") and rows[world.b.pk].total == D("0.40")
    assert hour.unallocated == 0


PROFILES = ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
SLICES = {
    "1g.10gb": (1, 1),
    "1g.20gb": (1, 2),
    "2g.20gb": (2, 2),
    "3g.40gb": (3, 4),
    "4g.40gb": (4, 4),
    "7g.80gb": (7, 8),
}


class RandomSlicedFleets(TestCase):
    @given(
        gpus=st.lists(
            st.lists(
                st.tuples(st.sampled_from(PROFILES), st.integers(0, 2), st.integers(0, 3600)),
                min_size=1,
                max_size=4,
            ),
            min_size=1,
            max_size=3,
        ),
        kinds=st.lists(
            st.sampled_from(["shared", "reserved", "dedicated"]), min_size=3, max_size=3
        ),
    )
    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    def test_pieces_add_up_to_their_gpus_and_pool_hours_conserve(self, gpus, kinds):
        world = make_world()
        world.sku.mig_capable = True
        world.sku.save()
        world.rate("energy", "0.173", "per_kwh")
        world.rate("colocation", "311.11", "per_gpu_month")
        pools = [
            world.pool(f"p{i}", kind=k, owner=None if k == "shared" else world.a)
            for i, k in enumerate(kinds)
        ]
        for k, pool in zip(kinds, pools, strict=True):
            if k == "reserved":
                world.reserve(world.a, pool, 1)
        for g, instances in enumerate(gpus):
            gpu = world.gpu(f"g{g}")
            compute = memory = 0
            for n, (profile, pool_index, seconds) in enumerate(instances):
                c, m = SLICES[profile]
                if compute + c > 7 or memory + m > 8:
                    continue  # would not fit: the service refuses it (tested apart)
                compute, memory = compute + c, memory + m
                replica = _mig(world, f"r{g}-{n}", pools[pool_index], gpu, profile, n)
                busy = min(seconds, 3600 * c // 7)
                if busy:
                    world.use([world.a, world.b][n % 2], replica, busy)

        run = world.allocate(start=H0, end=H0 + timedelta(hours=2))

        assert run.status == "done", run.error
        # Each GPU costs $1 an hour of capital however it is cut.
        capital = PoolHourCost.objects.aggregate(s=Sum("capital"))["s"]
        assert capital == 2 * len(gpus)
        for pool_hour in PoolHourCost.objects.all():
            rows = CostAllocation.objects.filter(hour=pool_hour.hour, pool=pool_hour.pool)
            assert (rows.aggregate(s=Sum("total"))["s"] or 0) == pool_hour.allocated
            assert pool_hour.allocated + pool_hour.unallocated == pool_hour.total
            assert pool_hour.unallocated >= 0
