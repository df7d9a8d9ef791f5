"""The scaled path's tests share a fleet of two replicas on a fake
upstream and two tenants billed in two currencies."""

from __future__ import annotations

import pytest

from tests.fleet import Fleet, fleet_model
from tests.gateway.fake_upstream import FakeUpstream


@pytest.fixture
def upstream():
    fake = FakeUpstream().start()
    yield fake
    fake.stop()


@pytest.fixture
def world(upstream):
    fleet = Fleet(gateway=None, model=fleet_model())
    fleet.add_tenant("a")
    fleet.add_tenant("b", currency="EUR")
    fleet.add_replica("alpha", upstream.base_url, "shared")
    fleet.add_replica("beta", upstream.base_url, "shared")
    return fleet
