"""The gateway's adaptive concurrency (the N it finds for each replica,
written every few seconds) is an operation, not a change a person made:
it makes no audit entry, and the fleet page still shows it; a person's
change of the same replica's settings is an entry as before."""

from __future__ import annotations

import pytest

from serving.models import Replica
from serving.services import replica_concurrency_record
from tests.conftest import client_for_user
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


def _replica_entries(finance) -> list[dict]:
    page = finance.get("/api/v1/audit/entries", {"limit": 1000})
    assert page.status_code == 200, page.json()
    return [e for e in page.json()["results"] if e["table"] == "serving_replica"]


def test_the_gateways_concurrency_changes_are_not_in_the_audit_trail(world, client):
    replica = world.replica("r1", world.pool("shared"), [world.gpu("g1")])
    finance_user = make_finance_user()
    finance = client_for_user(finance_user)
    before = len(_replica_entries(finance))

    # 16 changes, as the gateway wrote them in 9 minutes of the demo.
    for n in [8, 12, 16, 14, 10, 12, 18, 20, 16, 14, 12, 10, 8, 12, 16, 24]:
        replica_concurrency_record(limits={replica.pk: n})

    assert len(_replica_entries(finance)) == before
    client.force_login(finance_user)
    fleet = client.get("/fleet/").content.decode()
    cell = fleet.split('data-testid="replica-concurrency"')[1].split("</td>")[0]
    assert "24 found" in cell  # operations stay where operations are shown

    # A person's change to the replica's settings is still an entry.
    Replica.objects.filter(pk=replica.pk).update(max_inflight=32)
    (entry,) = _replica_entries(finance)[: len(_replica_entries(finance)) - before]
    assert entry["action"] == "update" and entry["changed"] == ["max_inflight"]
    assert audit_page_lists(client, "max_inflight")


def audit_page_lists(client, text: str) -> bool:
    return text in client.get("/audit/").content.decode()
