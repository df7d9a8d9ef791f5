"""Conservation across random fleets and loads: every pool-hour's cost is
allocated or left unallocated, exactly, never negative, and as each pool
kind and idle policy says."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
from django.db.models import Sum
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra.django import TestCase

from billing.costs.allocation import COMPONENTS, NO_OWNER, PoolHours, allocate, pool_hour_allocated
from billing.models import CostAllocation, PoolHourCost
from tests.billing.conftest import H0

TENANTS = [101, 102, 103]


@st.composite
def pool_hours_and_load(draw):
    n = draw(st.integers(min_value=1, max_value=6))
    kinds = draw(
        st.lists(st.sampled_from(["shared", "reserved", "dedicated"]), min_size=n, max_size=n)
    )
    gpus = np.array(draw(st.lists(st.integers(1, 8), min_size=n, max_size=n)))
    cost = lambda: np.array(draw(st.lists(st.integers(0, 10**13), min_size=n, max_size=n)))  # noqa: E731
    ph = PoolHours(
        owner=np.array([TENANTS[0] if k == "dedicated" else NO_OWNER for k in kinds]),
        reserved=np.array([k == "reserved" for k in kinds]),
        spread_idle=np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n))),
        capacity_seconds=gpus * 3600.0,
        capital=cost(),
        energy=cost(),
        other_opex=cost(),
    )
    usage = draw(
        st.lists(
            st.tuples(
                st.integers(0, n - 1),
                st.sampled_from(TENANTS),
                st.integers(-1, 2),
                st.floats(0.001, 40_000),
            ),
            max_size=20,
            unique_by=lambda u: u[:3],
        )
    )
    held = draw(
        st.lists(
            st.tuples(st.integers(0, n - 1), st.sampled_from(TENANTS), st.floats(1, 30_000)),
            max_size=6,
        )
    )
    return (
        kinds,
        ph,
        pd.DataFrame(usage, columns=["ph", "tenant", "model", "seconds"]),
        pd.DataFrame(held, columns=["ph", "tenant", "seconds"]),
    )


@given(pool_hours_and_load())
@settings(max_examples=300, deadline=None)
def test_allocation_conserves_every_pool_hour(case):
    kinds, ph, usage, held = case
    rows = allocate(ph, usage, held)
    allocated = pool_hour_allocated(ph, rows)
    unallocated = ph.total - allocated

    for column in (*COMPONENTS, "idle"):
        assert (rows[column] >= 0).all()
    assert (unallocated >= 0).all()
    assert not rows.duplicated(["ph", "tenant", "model"]).any()
    for i, kind in enumerate(kinds):
        used = usage[usage["ph"] == i]
        if kind == "dedicated":
            assert unallocated[i] == 0
            assert set(rows[rows["ph"] == i]["tenant"]) <= {TENANTS[0]} | set(used["tenant"])
            others = rows[(rows["ph"] == i) & (rows["tenant"] != TENANTS[0])]
            assert (others[[*COMPONENTS, "idle"]] == 0).all().all()
        if kind == "shared" and ph.spread_idle[i] and len(used):
            assert unallocated[i] == 0
        if kind == "shared" and not len(used):
            assert allocated[i] == 0
        if kind == "reserved" and not len(used):
            # The holders carry their reserved share of the cost (to rounding), no more.
            share = min(1.0, held[held["ph"] == i]["seconds"].sum() / ph.capacity_seconds[i])
            assert abs(int(allocated[i]) - ph.total[i] * share) <= 3 + ph.total[i] * 1e-12


class TestConservationThroughTheJob(TestCase):
    """Random fleets and loads through the whole job and the database."""

    @given(
        shape=st.lists(
            st.tuples(
                st.sampled_from(["shared", "reserved", "dedicated"]),
                st.integers(1, 3),
                st.booleans(),
            ),
            min_size=1,
            max_size=4,
        ),
        load=st.lists(
            st.tuples(
                st.integers(0, 3), st.integers(0, 1), st.integers(0, 2), st.integers(1, 3 * 3600)
            ),
            max_size=10,
            unique_by=lambda u: u[:3],
        ),
    )
    @settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
    def test_rows_sum_to_each_pool_hours_allocated_cost(self, shape, load):
        from tests.billing.conftest import World, make_world

        world: World = make_world()
        world.rate("energy", "0.173", "per_kwh")
        world.rate("colocation", "311.11", "per_gpu_month")
        replicas = []
        for i, (kind, n_gpus, spread) in enumerate(shape):
            owner = world.a if kind != "shared" else None
            pool = world.pool(
                f"p{i}", kind=kind, owner=owner, policy="spread" if spread else "platform"
            )
            replicas.append(
                world.replica(f"r{i}", pool, [world.gpu(f"g{i}-{j}") for j in range(n_gpus)])
            )
            if kind == "reserved":
                world.reserve(world.a, pool, 1)
        per_use: dict = {}
        for pool_index, tenant, hour, seconds in load:
            key = (pool_index % len(replicas), tenant, hour)
            per_use[key] = per_use.get(key, 0) + seconds
        for (replica_index, tenant, hour), seconds in per_use.items():
            replica = replicas[replica_index]
            seconds = min(seconds, replica.gpus.count() * 3600 // 2)
            world.use([world.a, world.b][tenant], replica, seconds, hour=H0 + timedelta(hours=hour))

        run = world.allocate(start=H0, end=H0 + timedelta(hours=3))

        assert run.status == "done"
        for pool_hour in PoolHourCost.objects.all():
            rows = CostAllocation.objects.filter(hour=pool_hour.hour, pool=pool_hour.pool)
            assert (rows.aggregate(s=Sum("total"))["s"] or 0) == pool_hour.allocated
            assert pool_hour.unallocated >= 0
            if pool_hour.pool_kind == "dedicated":
                assert pool_hour.unallocated == 0
        assert PoolHourCost.objects.count() == 3 * len(shape)


def test_the_check_finds_rows_that_no_longer_add_up(world):
    from decimal import Decimal

    from billing.costs.checks import allocation_conservation_check

    pool = world.pool("shared")
    replica = world.replica("r1", pool, [world.gpu("g1")])
    world.use(world.a, replica, 1800)
    world.use(world.b, replica, 600)
    world.allocate()
    since = H0 - timedelta(days=1)
    assert allocation_conservation_check(since=since) == []

    row = CostAllocation.objects.get(tenant=world.a)
    CostAllocation.objects.filter(pk=row.pk).update(
        idle=row.idle + Decimal("0.01"), total=row.total + Decimal("0.01")
    )
    duplicate = CostAllocation.objects.get(tenant=world.b)
    duplicate.pk = None
    duplicate.save()

    problems = [b.problem for b in allocation_conservation_check(since=since)]
    assert len(problems) == 2
    assert any(p.startswith("rows sum to") for p in problems)
    assert any(p.startswith("2 rows for tenant") for p in problems)

    world.allocate()  # a re-run repairs the hour
    assert allocation_conservation_check(since=since) == []
