"""Spend limits on a Redis Cluster, with the master holding the tenant's
accounts SIGKILLed in the middle of a burst: sixty clients on two
gateway processes, a budget that pays for about eighty requests. Its replica is
promoted; the gateways refuse (503) while no master serves the slot,
find the new one, and go on; and the tenant's spend, re-derived from the
ledger afterwards, is never past its limit: each reservation and
settlement was on a replica before it counted (WAIT), so the promoted
replica lost none of them."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from billing.spend.accounts import RedisSpend, redis_spend_state
from billing.spend.terms import spend_terms
from tests.fleet import (
    Fleet,
    fleet_done,
    fleet_model,
    ledger_events_clear,
    metering_run_all,
    start_gateway,
    stop_gateway,
    wait_for_fleet,
    wait_for_records_written,
)
from tests.gateway.test_gateway_spend_live import LONG_CACHE, cheap_output, flood

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]
D = Decimal
WORST_CASE = D("0.005")
LIMIT = D("0.25")  # fifty requests' worst case (0.005: 5 output tokens), ~80 charged


def test_a_cluster_master_killed_mid_burst_lets_no_spend_pass_its_limit(fake, redis_cluster):
    fake.delay = 0.05
    prefix = f"test-{uuid.uuid4().hex}"
    env = {**LONG_CACHE, "LIMITS_REDIS_URL": redis_cluster.url, "GATEWAY_REDIS_PREFIX": prefix}
    started = [start_gateway(env=env) for _ in range(2)]
    urls = [url for _, url in started]
    try:
        fleet = Fleet(gateway=urls[0], model=fleet_model())
        tenant = fleet.add_tenant("racer", monthly_budget=LIMIT, budget_hard_percent=100)
        fleet.add_replica("fake", fake.base_url, "shared", max_inflight=64)
        cheap_output(fleet)
        for url in urls:
            wait_for_fleet(url, replicas=1)
        (account,) = spend_terms(tenant=tenant, now=datetime.now(UTC)).accounts
        holder = redis_cluster.master_of(RedisSpend.keys_of(account.key, prefix)[0])

        killed_at = {}

        def kill_when_a_third_is_served():
            while len(fake.requests) < 25:
                time.sleep(0.005)
            killed_at["served"] = len(fake.requests)
            redis_cluster.kill(holder)

        killer = threading.Thread(target=kill_when_a_third_is_served)
        killer.start()
        answers = asyncio.run(flood(urls, fleet.secrets["racer"], clients=60, each=6))
        killer.join(timeout=60)
        redis_cluster.wait_ok()

        ok = [r for r in answers if r.status_code == 200]
        refused = {r.status_code for r in answers if r.status_code != 200}
        assert refused <= {402, 503}, refused
        assert 402 in refused  # the budget, not the outage, ended the burst
        assert killed_at["served"] + 10 < len(ok)  # served on after the failover
        assert redis_cluster.master_of(RedisSpend.keys_of(account.key, prefix)[0]) != holder
        for url in urls:
            wait_for_records_written(url)
        metering_run_all()
        (account,) = spend_terms(tenant=tenant, now=datetime.now(UTC)).accounts
        assert account.spent <= LIMIT  # by the ledger: never past it
        assert account.spent > LIMIT - WORST_CASE  # ... and the budget was used, not lost
        # The promoted replica lost no settlement: the cluster's count is the ledger's.
        state = redis_spend_state(redis_cluster.url, account.key, prefix=prefix)
        assert state is not None and state.spent >= account.spent
        fleet_done(*urls)
    finally:
        for proc, _ in started:
            stop_gateway(proc)
        ledger_events_clear()
