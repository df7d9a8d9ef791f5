"""Capacity at SLO and GPUs needed, pure: the statuses a replica's hours
can give, and the flags a pool can earn."""

from __future__ import annotations

import pandas as pd

from planning.capacity import MEASURED, MISSES, NOT_REACHED, Slo, capacity_at_slo
from planning.provisioning import model_need, pool_need

SLO = Slo(ttft_ms=2000, itl_ms=250)


def hours(ttft, *, n=48, itl=lambda tokens: 30.0) -> pd.DataFrame:
    tokens = [10_000 * (h + 1) for h in range(n)]
    return pd.DataFrame(
        {
            "tokens": tokens,
            "requests": [50] * n,
            "busy_seconds": [t / 100 for t in tokens],
            "ttft_p95_ms": pd.array([ttft(t) for t in tokens], dtype="Float64"),
            "itl_p95_ms": pd.array([itl(t) for t in tokens], dtype="Float64"),
        }
    )


def test_a_replica_that_met_its_slo_at_every_load_has_at_least_the_heaviest():
    found = capacity_at_slo(hours(lambda t: 500.0), SLO)
    assert found.status == NOT_REACHED
    assert found.tokens_per_hour == found.curve[-1]["tokens_per_hour"]
    assert found.note.startswith("at least")


def test_a_replica_that_missed_at_its_lightest_load_has_no_capacity_to_plan_on():
    found = capacity_at_slo(hours(lambda t: 5000.0), SLO)
    assert (found.status, found.tokens_per_hour) == (MISSES, None)
    assert "even at its lightest load" in found.note


def test_the_inter_token_target_binds_where_it_is_crossed_first():
    # TTFT never misses; inter-token p95 = 30 + t / 1000: 250 ms at 220,000.
    found = capacity_at_slo(hours(lambda t: 100.0, itl=lambda t: 30 + t / 1000), SLO)
    assert found.status == MEASURED
    assert abs(found.tokens_per_hour - 220_000) < 1


def test_a_reserved_pool_holding_fewer_gpus_than_reserved_is_short_of_contract():
    need = model_need(
        model="m", peak=100, headroom_percent=20, capacities=[(1000, 1)], replica_gpus=[1]
    )
    assert need.gpus_needed == 1
    assert pool_need(gpus_held=1, models=[need], contracted=3).flags == ["ok", "short_of_contract"]
    assert pool_need(gpus_held=3, models=[need], contracted=3).flags == ["over"]


def test_replicas_come_whole():
    # 2.4 GPUs wanted of 2-GPU replicas: two replicas, four GPUs.
    need = model_need(
        model="m", peak=2000, headroom_percent=20, capacities=[(2000, 2)], replica_gpus=[2, 2]
    )
    assert (need.gpus_needed, need.note) == (4, "2 replicas of 2 GPU")
