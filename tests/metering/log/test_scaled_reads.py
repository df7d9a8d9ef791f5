"""Reads of raw events on the scaled path come from the store and answer
what the ledger's answer: the request trace (its rows, device-seconds,
billed tokens and charge, found by its id alone), the usage page's latest
requests, and reconciliation's metered tokens. The same requests are
recorded into the PostgreSQL ledger and read through the pages; then the
ledger is emptied, the requests written into the Delta table by a writer,
attributed from there, and read again: the same figures, and a tenant
still finds nothing of another tenant's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test import override_settings

from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.log.stream import LogConfig
from metering.log.writer import Writer, _Partition
from metering.models import ReconciliationGap
from metering.reconciliation import reconciliation_compute
from serving.models import ReplicaMetricSample
from serving.records import gateway_request_id
from tests.factories import make_finance_user, make_list_price, make_member
from tests.ledger import disaggregated_pair
from tests.usage_log import ledger_truncate

pytestmark = pytest.mark.django_db(transaction=True)

PROCESS = "3f9a1c0e5b7d2a64"


def _history(ledger, at: datetime) -> list[dict]:
    hour = int(at.timestamp()) // 3600
    prefill, decode = disaggregated_pair(ledger)
    gw = [gateway_request_id(PROCESS, hour=hour, number=n) for n in range(3)]
    return [
        ledger.event(gw[0], at=at, prompt_tokens=120, cached_tokens=20, completion_tokens=30),
        ledger.event(gw[1], at=at + timedelta(seconds=2), tenant=ledger.b),
        # A disaggregated request: its prompt on one replica, its answer on the other.
        ledger.event(
            gw[2],
            at=at + timedelta(seconds=4),
            phase="prefill",
            replica_id=prefill.pk,
            pool_id=prefill.pool_id,
            completion_tokens=1,
        ),
        ledger.event(
            gw[2],
            at=at + timedelta(seconds=5),
            phase="decode",
            replica_id=decode.pk,
            pool_id=decode.pool_id,
            prompt_tokens=120,
            completion_tokens=40,
        ),
        # Another serving tier's id, which says no hour: found in the last hours.
        ledger.event("engine-7", at=at + timedelta(seconds=6), completion_tokens=12),
    ]


def _read(client, ledger, ids) -> dict:
    """What the pages show of each request, and of the latest requests."""
    shown = {}
    client.force_login(make_finance_user())
    for request_id in ids:
        page = client.get(f"/requests/{request_id}/")
        assert page.status_code == 200, request_id
        c = page.context
        shown[request_id] = (
            c["event"].tenant_id,
            c["event"].phase,
            c["event"].replica_id,
            c["event"].prompt_tokens,
            c["device_seconds"],
            c["charge"].total if c["charge"] else None,
            c["rollup"].pk is not None if c["rollup"] else None,
        )
    member = make_member(ledger.a)
    client.force_login(member.user)
    assert client.get(f"/requests/{ids[1]}/").status_code == 404  # tenant b's
    assert client.get(f"/requests/{ids[0]}/").status_code == 200
    recent = client.get("/usage/").context["requests"]
    shown["recent"] = [(e.request_id, e.phase) for e in recent]
    member.user.delete()
    return shown


def _reconciled(ledger, at: datetime) -> list[tuple]:
    ReconciliationGap.objects.all().delete()
    start = at.replace(minute=0, second=0, microsecond=0)
    return [
        (
            gap.metered_prompt_tokens,
            gap.metered_generation_tokens,
            gap.vllm_prompt_tokens,
        )
        for gap in (
            reconciliation_compute(replica=r, start=start, end=start + timedelta(hours=1))
            for r in (ledger.replica, ledger.other_replica)
        )
    ]


def test_the_trace_the_latest_requests_and_reconciliation_read_the_store_as_the_ledger(
    client, ledger, tmp_path, settings
):
    now = datetime.now(UTC)
    at = now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=2) + timedelta(minutes=5)
    events = _history(ledger, at)
    ids = list(dict.fromkeys(e["request_id"] for e in events))
    make_list_price(ledger.model, effective_from=at - timedelta(days=60))
    hour = at.replace(minute=0, second=0, microsecond=0)
    for replica in (ledger.replica, ledger.other_replica):
        for scraped, total in ((hour, 0), (hour + timedelta(minutes=30), 1000)):
            ReplicaMetricSample.objects.create(
                replica=replica,
                scraped_at=scraped,
                up=True,
                prompt_tokens_total=total,
                generation_tokens_total=total // 10,
            )

    usage_record_batch(events=events, source=EventSource.API)
    metering_run(now=now)
    on_ledger = _read(client, ledger, ids)
    reconciled_ledger = _reconciled(ledger, at)
    assert on_ledger[ids[0]][3:5] == (120, on_ledger[ids[0]][4]) and on_ledger[ids[0]][4] > 0
    assert on_ledger[ids[2]][1] == "decode"  # the disaggregated one by its answer
    assert reconciled_ledger[0][0] == 120 + 20 + 20  # r1: both tenants

    ledger_truncate()
    cfg = {
        **settings.USAGE_LOG,
        "URL": "nats://127.0.0.1:1",  # the scaled path (nothing is read from the log here)
        "STORE_URL": str(tmp_path / "store"),
        "DEAD_LETTER_DIR": str(tmp_path / "dead"),
        "DASK_SCHEDULER": "",
    }
    with override_settings(USAGE_LOG=cfg):
        writer = Writer(LogConfig.from_settings(cfg), writer_id="w")
        partition = _Partition(0, revision=1, renewed=0.0, committed=0, read_to=len(events))
        partition.events = [(dict(e, source="api"), n + 1) for n, e in enumerate(events)]
        assert writer._write([partition]) == len(events)
        metering_run(now=now)
        on_store = _read(client, ledger, ids)
        reconciled_store = _reconciled(ledger, at)
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM metering_usageevent")
            assert cursor.fetchone() == (0,)  # no raw row in PostgreSQL

    assert on_store == on_ledger
    assert reconciled_store == reconciled_ledger
