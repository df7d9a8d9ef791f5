"""Attribution windows and rollups against the real ledger: shares stored
per request, conservation exact, late usage re-opening its window, hours
rebuilt whole."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.models import (
    AttributionShare,
    AttributionWindow,
    DirtyHour,
    RequestShares,
    UsageRollup,
)
from metering.rollups import usage_rollup_hours
from metering.windows import (
    REPLICAS_PER_READ,
    attribution_conservation_check,
    attribution_window_compute,
)
from serving.gpu_shares import GPU_UNITS
from serving.services import local_gpu_ensure, replica_register
from tests.metering.conftest import T0

API = EventSource.API
AFTER = T0 + timedelta(hours=3)  # every window of the tests is due by then
HOUR_NS = 3600 * 10**9


def record(ledger, *events):
    usage_record_batch(events=list(events), source=API)


def shares(window) -> dict[str, Decimal]:
    """Each request's device-seconds in `window`."""
    stored = RequestShares.objects.filter(window=window).first()
    return stored.as_seconds() if stored else {}


def test_a_tenant_alone_gets_exactly_its_resident_time(ledger):
    record(ledger, ledger.event("solo"))  # scheduled T0+0.1 s, last token T0+1.0 s
    run = metering_run(now=AFTER)
    assert run.windows == 1
    window = AttributionWindow.objects.get()
    assert window.status == "done" and window.gpu_units == GPU_UNITS and window.requests == 1
    assert shares(window) == {"solo": Decimal("0.900000000")}
    assert window.attributed_ns + window.idle_ns == window.capacity_ns == HOUR_NS
    assert window.idle_seconds == Decimal("3599.100000000")


def test_identical_load_from_two_tenants_is_split_evenly(ledger):
    record(ledger, ledger.event("a1"), ledger.event("b1", tenant=ledger.b))
    metering_run(now=AFTER)
    assert shares(AttributionWindow.objects.get()) == {
        "a1": Decimal("0.450000000"),
        "b1": Decimal("0.450000000"),
    }


def test_a_request_spanning_windows_is_split_by_time(ledger):
    # Sent 12:59:30; scheduled 12:59:30.1; last token 13:00:30.
    at = T0 + timedelta(minutes=59, seconds=30)
    record(
        ledger,
        ledger.event(
            "long", at=at, ended_at=at + timedelta(seconds=60), generation_ms=Decimal("59700")
        ),
    )
    metering_run(now=AFTER)
    first, second = AttributionWindow.objects.order_by("start")
    assert shares(first) == {"long": Decimal("29.900000000")}
    assert shares(second) == {"long": Decimal("30.000000000")}


def test_late_usage_reopens_and_reattributes_its_window(ledger):
    record(ledger, ledger.event("early"))
    metering_run(now=AFTER)
    window = AttributionWindow.objects.get()
    record(ledger, ledger.event("late", tenant=ledger.b))  # same second, arrives afterwards
    window.refresh_from_db()
    assert window.status == "pending"
    metering_run(now=AFTER)
    window.refresh_from_db()
    assert window.status == "done"
    assert shares(window) == {"early": Decimal("0.450000000"), "late": Decimal("0.450000000")}
    assert attribution_conservation_check(since=T0 - timedelta(days=1)) == []


def test_rerunning_a_window_gives_the_same_rows(ledger):
    record(ledger, ledger.event("x"), ledger.event("y", at=T0 + timedelta(milliseconds=500)))
    metering_run(now=AFTER)
    window = AttributionWindow.objects.get()
    before = shares(window)
    groups = list(AttributionShare.objects.values_list("tenant_id", "requests", "device_ns"))
    attribution_window_compute(window_id=window.pk)
    assert shares(window) == before
    assert (
        list(AttributionShare.objects.values_list("tenant_id", "requests", "device_ns")) == groups
    )
    assert RequestShares.objects.count() == 1


def test_the_check_reports_a_broken_window(ledger):
    record(ledger, ledger.event("x"))
    metering_run(now=AFTER)
    AttributionShare.objects.update(device_ns=1)
    (found,) = attribution_conservation_check(since=T0 - timedelta(days=1))
    assert found.shares_ns == 1 and found.attributed_ns == 900_000_000
    assert found.requests_ns == 900_000_000


def test_windows_not_yet_closed_wait(ledger):
    record(ledger, ledger.event("x"))
    assert metering_run(now=T0 + timedelta(minutes=30)).windows == 0
    assert AttributionWindow.objects.get().status == "pending"


def test_rollups_sum_tokens_requests_and_device_seconds_per_tenant(ledger):
    record(
        ledger,
        ledger.event("a1"),
        ledger.event("a2", at=T0 + timedelta(seconds=5), cached_tokens=8),
        ledger.event(
            "b1",
            tenant=ledger.b,
            at=T0 + timedelta(seconds=10),
            status="aborted",
            completion_tokens=4,
        ),
        ledger.event(
            "b2",
            tenant=ledger.b,
            status="rejected",
            http_status=429,
            replica_id=None,
            prompt_tokens=0,
            completion_tokens=0,
        ),
    )
    run = metering_run(now=AFTER)
    assert run.hours == [T0]
    assert not DirtyHour.objects.exists()
    a = UsageRollup.objects.get(tenant=ledger.a)
    assert (a.hour, a.prompt_tokens, a.cached_tokens, a.completion_tokens) == (T0, 40, 8, 20)
    assert (a.requests_ok, a.device_seconds) == (2, Decimal("1.800000000"))
    served, rejected = UsageRollup.objects.filter(tenant=ledger.b).order_by("replica_id")
    assert (served.requests_aborted, served.completion_tokens) == (1, 4)
    assert served.device_seconds == Decimal("0.900000000")
    assert (rejected.replica_id, rejected.requests_rejected) == (None, 1)
    # Rebuilding the hour writes the same rows again, never twice.
    usage_rollup_hours(hours=[T0])
    assert UsageRollup.objects.count() == 3


def test_rollups_sum_the_gateway_queue_time_of_requests_that_recorded_it(ledger):
    record(
        ledger,
        ledger.event("a1", gateway_queue_ms=Decimal("12.5")),
        ledger.event("a2", at=T0 + timedelta(seconds=5), gateway_queue_ms=Decimal("0")),
        ledger.event("a3", at=T0 + timedelta(seconds=9)),  # not measured
        ledger.event(
            "a4",
            at=T0 + timedelta(seconds=20),
            status="rejected",
            http_status=429,
            replica_id=None,
            gateway_queue_ms=Decimal("3000"),  # waited, then timed out in the queue
        ),
        ledger.event("b1", tenant=ledger.b, gateway_queue_ms=Decimal("1.25")),
    )
    metering_run(now=AFTER)

    def queue_time(tenant):
        rows = UsageRollup.objects.filter(tenant=tenant).order_by("replica_id")
        return [
            (r.gateway_queue_ms_sum, r.gateway_queue_requests, r.gateway_queued_requests)
            for r in rows
        ]

    expected_a = [(Decimal("12.500"), 2, 1), (Decimal("3000.000"), 1, 1)]  # served, rejected
    assert queue_time(ledger.a) == expected_a
    assert queue_time(ledger.b) == [(Decimal("1.250"), 1, 1)]
    usage_rollup_hours(hours=[T0])  # rebuilt whole: the same sums, not doubled
    assert queue_time(ledger.a) == expected_a


def test_a_gateway_timed_request_is_resident_for_the_gateways_window(ledger):
    """No engine timings (an engine that reports token counts only): the
    request holds the replica from the moment it was sent to its last byte,
    and the hour's rollup counts it as gateway-timed."""
    untimed = {"queue_ms": None, "ttft_ms": None, "generation_ms": None}
    record(ledger, ledger.event("window", **untimed), ledger.event("engine", tenant=ledger.b))
    metering_run(now=AFTER)
    # sent T0 to ended T0+1 s; the engine-timed one 0.1 s to 1.0 s.
    # [0, 0.1): window alone; [0.1, 1.0): both, halves.
    assert shares(AttributionWindow.objects.get()) == {
        "window": Decimal("0.550000000"),
        "engine": Decimal("0.450000000"),
    }
    timed = dict(UsageRollup.objects.values_list("tenant_id", "requests_gateway_timed"))
    assert timed == {ledger.a.pk: 1, ledger.b.pk: 0}


def test_an_inference_time_reported_whole_runs_from_scheduling(ledger):
    """TGI reports its queue time and its inference time (prefill and
    decode together), no time to first token: resident from scheduling
    (sent + queue) for the inference time, whatever the gateway saw."""
    record(ledger, ledger.event("tgi", ttft_ms=None, generation_ms=Decimal("500")))
    metering_run(now=AFTER)
    assert shares(AttributionWindow.objects.get()) == {"tgi": Decimal("0.500000000")}


@pytest.mark.parametrize("policy", ["equal", "roofline"])
def test_conservation_holds_for_a_busy_hour(ledger, policy):
    events = [
        ledger.event(
            f"r{i}",
            tenant=(ledger.a, ledger.b)[i % 2],
            at=T0 + timedelta(seconds=i * 7.3),
            prompt_tokens=10 + i,
            generation_ms=Decimal(1000 + 37 * i),
        )
        for i in range(200)
    ]
    record(ledger, *events)
    window = AttributionWindow.objects.get(start=T0)
    outcome = attribution_window_compute(window_id=window.pk, policy=policy)
    assert outcome.attributed_ns + outcome.idle_ns == HOUR_NS
    total = sum(s.device_ns for s in AttributionShare.objects.filter(window=window))
    assert total == outcome.attributed_ns
    per_request = RequestShares.objects.get(window=window)
    assert len(per_request.request_ids) == 200 and sum(per_request.device_ns) == total
    by_tenant = {
        s.tenant_id: (s.requests, s.device_ns)
        for s in AttributionShare.objects.filter(window=window)
    }
    assert by_tenant[ledger.a.pk][0] == by_tenant[ledger.b.pk][0] == 100


def test_request_ids_with_commas_and_quotes_survive_attribution(ledger):
    odd = 'edge,7f"3a\\b\tc{d}'
    record(ledger, ledger.event(odd))
    metering_run(now=AFTER)
    assert shares(AttributionWindow.objects.get()) == {odd: Decimal("0.900000000")}


def test_a_requests_device_seconds_per_window_for_its_tenant_only(ledger):
    from metering.selectors.requests import request_device_seconds

    at = T0 + timedelta(minutes=59, seconds=30)
    event = ledger.event(
        "span", at=at, ended_at=at + timedelta(seconds=60), generation_ms=Decimal("59700")
    )
    record(ledger, event)
    metering_run(now=AFTER)
    assert request_device_seconds(tenant=ledger.a, request_id="span") == {
        T0: Decimal("29.900000000"),
        T0 + timedelta(hours=1): Decimal("30.000000000"),
    }
    assert request_device_seconds(tenant=ledger.b, request_id="span") == {}


def test_a_run_while_another_holds_the_lock_is_skipped(ledger):
    """Beat fires every minute; a long run must not be doubled by the next."""
    from tests.services import database_session

    record(ledger, ledger.event("x"))
    other = database_session(autocommit=True)
    try:
        other.execute("SELECT pg_advisory_lock(hashtext('metering_run'))")
        assert metering_run(now=AFTER).skipped
        other.execute("SELECT pg_advisory_unlock(hashtext('metering_run'))")
        assert metering_run(now=AFTER).windows == 1
    finally:
        other.close()


def test_replicas_read_together_are_each_attributed_only_their_own_requests(ledger):
    """More replicas than one read of the ledger takes (REPLICAS_PER_READ):
    each replica's window holds its own requests, as computed alone."""
    replicas = [ledger.replica, ledger.other_replica]
    for n in range(REPLICAS_PER_READ + 1 - len(replicas)):
        replicas.append(
            replica_register(
                name=f"r-extra-{n}",
                base_url=f"http://127.0.0.1:{9100 + n}",
                model=ledger.model,
                pool=ledger.pool,
                gpus=[local_gpu_ensure(serial=f"gpu-extra-{n}")],
            )
        )
    # Replica k serves k requests (the first none), from T0 + k s.
    for k, replica in enumerate(replicas):
        record(
            ledger,
            *(
                ledger.event(f"r{k}-{i}", replica_id=replica.pk, at=T0 + timedelta(seconds=k))
                for i in range(k)
            ),
        )
    # The first replica's window marked, its usage since gone: nothing of
    # it in the read, its window all idle.
    AttributionWindow.objects.create(
        replica=replicas[0], start=T0, end=T0 + timedelta(hours=1), status="pending", marked_at=T0
    )
    run = metering_run(now=AFTER)
    assert run.windows == len(replicas)
    for k, replica in enumerate(replicas):
        window = AttributionWindow.objects.get(replica=replica)
        assert window.requests == k
        assert set(shares(window)) == {f"r{k}-{i}" for i in range(k)}
        # k requests resident together for 0.9 s: 0.9 s of the GPU in all.
        assert window.attributed_ns == (900_000_000 if k else 0)
    assert attribution_conservation_check(since=T0 - timedelta(days=1)) == []
