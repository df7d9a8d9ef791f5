"""A replica's status as the health checks write it: a verdict changes the
row once (the second gateway to find the same writes nothing and tells no
gateway), never over an operator's draining, and `status_since` moves only
when the status does, whoever writes it (health checks, the scraper,
registration)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from serving.choices import ReplicaStatus
from serving.models import Replica
from serving.services import (
    local_gpu_ensure,
    pool_ensure,
    replica_health_record,
    replica_register,
    replica_set_status,
    served_model_ensure,
)
from tests.conftest import client_for_user
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


def _register(name: str = "r") -> Replica:
    return replica_register(
        name=name,
        base_url="http://127.0.0.1:9",
        model=served_model_ensure(name="m"),
        pool=pool_ensure(name="shared"),
        gpus=[local_gpu_ensure(serial=f"g-{name}")],
    )


def _notified(queries: CaptureQueriesContext) -> int:
    return sum("pg_notify" in q["sql"] for q in queries.captured_queries)


def test_a_verdict_changes_the_row_once_whoever_finds_it_next():
    replica, other = _register("r"), _register("other")
    found = timezone.now()
    with CaptureQueriesContext(connection) as first:
        assert replica_health_record(replica_id=replica.pk, up=False, reason="gone", at=found)
    with CaptureQueriesContext(connection) as second:
        assert not replica_health_record(
            replica_id=replica.pk, up=False, reason="gone too", at=found + timedelta(seconds=1)
        )
    assert (_notified(first), _notified(second)) == (1, 0)
    replica.refresh_from_db()
    assert (replica.status, replica.status_since, replica.last_error) == ("down", found, "gone")
    assert Replica.objects.get(pk=other.pk).status == ReplicaStatus.UP  # only that one

    back = found + timedelta(minutes=1)
    assert replica_health_record(replica_id=replica.pk, up=True, reason="", at=back)
    assert not replica_health_record(replica_id=replica.pk, up=True, reason="", at=back)
    replica.refresh_from_db()
    assert (replica.status, replica.status_since, replica.last_error) == ("up", back, "")
    assert replica.last_seen_at == back


def test_a_draining_replica_stays_draining():
    replica = _register()
    replica_set_status(replica=replica, status=ReplicaStatus.DRAINING)
    for up in (False, True):
        assert not replica_health_record(
            replica_id=replica.pk, up=up, reason="x", at=timezone.now()
        )
    assert Replica.objects.get(pk=replica.pk).status == ReplicaStatus.DRAINING


def test_status_since_moves_only_when_the_status_does():
    replica = _register()
    registered = Replica.objects.get(pk=replica.pk).status_since
    assert registered is not None
    replica_set_status(replica=replica, status=ReplicaStatus.UP)  # the scraper, again
    assert Replica.objects.get(pk=replica.pk).status_since == registered
    _register()  # registered again while up
    assert Replica.objects.get(pk=replica.pk).status_since == registered

    replica_set_status(replica=replica, status=ReplicaStatus.DOWN, error="silent")
    down_since = Replica.objects.get(pk=replica.pk).status_since
    assert down_since > registered and replica.status_since == down_since
    replica_set_status(replica=replica, status=ReplicaStatus.DOWN, error="still silent")
    assert Replica.objects.get(pk=replica.pk).status_since == down_since
    _register()  # registered again: up from now
    assert Replica.objects.get(pk=replica.pk).status_since > down_since


def test_an_operator_setting_the_status_through_the_api_moves_since():
    replica = _register()
    registered = Replica.objects.get(pk=replica.pk).status_since
    api = client_for_user(make_finance_user())
    url = f"/api/v1/fleet/replicas/{replica.pk}"
    answer = api.patch(url, {"max_inflight": 8}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json()["status_since"] == registered.isoformat().replace("+00:00", "Z")
    answer = api.patch(
        url, {"status": "draining", "status_since": "2000-01-01T00:00:00Z"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    draining = Replica.objects.get(pk=replica.pk).status_since
    assert draining > registered  # now, not what the client sent
