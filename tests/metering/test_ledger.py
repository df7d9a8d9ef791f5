"""The usage ledger: idempotent by request id, all-or-nothing per batch,
every field validated with the offending field named."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from metering.choices import EventSource
from metering.ledger import BatchRejected, usage_record_batch
from metering.models import AttributionWindow, DirtyHour, UsageEvent, UsageKey
from metering.partitions import partition_name, usage_partitions_list
from tests.factories import make_tenant
from tests.metering.conftest import T0

API = EventSource.API


def test_a_batch_lands_whole_and_again_changes_nothing(ledger):
    batch = [ledger.event("r1"), ledger.event("r2", tenant=ledger.b, completion_tokens=3)]
    first = usage_record_batch(events=batch, source=API)
    assert (first.accepted, first.duplicates) == (["r1", "r2"], [])
    again = usage_record_batch(events=batch, source=API)
    assert (again.accepted_count, again.duplicate_count) == (0, 2)
    assert UsageEvent.objects.count() == 2 and UsageKey.objects.count() == 2
    row = UsageEvent.objects.get(request_id="r2")
    assert (row.tenant_id, row.prompt_tokens, row.completion_tokens) == (ledger.b.pk, 20, 3)
    assert row.pool_id == ledger.pool.pk  # from the replica when not given
    assert row.served_model_id == ledger.model.pk
    assert row.queue_ms == Decimal("100.000") and row.source == "api"


def test_a_duplicate_inside_one_batch_is_counted_once(ledger):
    result = usage_record_batch(
        events=[ledger.event("r1"), ledger.event("r1", completion_tokens=99)], source=API
    )
    assert (result.accepted, result.duplicates) == (["r1"], ["r1"])
    assert UsageEvent.objects.get().completion_tokens == 10


def test_a_resent_event_with_another_time_is_still_a_duplicate(ledger):
    """Uniqueness is by request id across every monthly partition."""
    usage_record_batch(events=[ledger.event("r1")], source=API)
    later = ledger.event("r1", at=T0 + timedelta(days=40))
    assert usage_record_batch(events=[later], source=API).duplicate_count == 1
    assert UsageEvent.objects.count() == 1


def test_partitions_ahead_span_the_year_boundary(db):
    from datetime import UTC, datetime

    from metering.partitions import usage_partitions_ensure_ahead

    usage_partitions_ensure_ahead(now=datetime(2027, 1, 15, tzinfo=UTC), months_ahead=2)
    names = set(usage_partitions_list())
    for month in ("y2026m12", "y2027m01", "y2027m02", "y2027m03"):
        assert f"metering_usageevent_{month}" in names


def test_partitions_are_monthly_and_created_on_demand(ledger):
    usage_record_batch(
        events=[ledger.event("oct"), ledger.event("nov", at=T0 + timedelta(days=31))], source=API
    )
    names = usage_partitions_list()
    assert {partition_name(T0.date()), "metering_usageevent_y2026m11"} <= set(names)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_tokens": -1}, "prompt_tokens"),
        ({"completion_tokens": "7"}, "completion_tokens"),
        ({"cached_tokens": 21}, "cached_tokens"),
        ({"ended_at": T0 - timedelta(seconds=1), "sent_at": None}, "ended_at"),
        ({"tenant_id": 10**9}, "tenant_id"),
        ({"model": "no-such-model"}, "model"),
        ({"replica_id": 10**9}, "replica_id"),
        ({"replica_id": None}, "replica_id"),
        ({"status": "fine"}, "status"),
        ({"received_at": "yesterday"}, "received_at"),
        ({"received_at": T0.replace(tzinfo=None)}, "received_at"),
        ({"queue_ms": -5}, "queue_ms"),
        ({"gateway_queue_ms": -5}, "gateway_queue_ms"),
        ({"gateway_queue_ms": "soon"}, "gateway_queue_ms"),
        ({"request_id": ""}, "request_id"),
        ({"sent_at": T0 + timedelta(hours=1)}, "sent_at"),
        ({"first_token_at": T0 - timedelta(seconds=2)}, "first_token_at"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(ledger, change, field):
    batch = [ledger.event("good"), ledger.event("bad", **change)]
    with pytest.raises(BatchRejected) as rejected:
        usage_record_batch(events=batch, source=API)
    (error,) = rejected.value.errors
    assert (error.index, error.field) == (1, field)
    assert not UsageEvent.objects.exists() and not UsageKey.objects.exists()
    assert not AttributionWindow.objects.exists() and not DirtyHour.objects.exists()


def test_a_timestamp_in_the_future_is_refused(ledger):
    soon = timezone.now() + timedelta(hours=1)
    with pytest.raises(BatchRejected) as rejected:
        usage_record_batch(events=[ledger.event("f", at=soon)], source=API)
    assert rejected.value.errors[0].field == "ended_at"
    assert "future" in rejected.value.errors[0].message


def test_names_instead_of_ids_for_other_serving_tiers(ledger):
    event = ledger.event("ext", tenant_id=None, replica_id=None)
    event.update(tenant=ledger.b.slug, replica=ledger.other_replica.name)
    usage_record_batch(events=[event], source=API)
    row = UsageEvent.objects.get()
    assert (row.tenant_id, row.replica_id) == (ledger.b.pk, ledger.other_replica.pk)


def test_rejected_requests_need_no_replica_or_known_model(ledger):
    event = ledger.event("r", status="rejected", http_status=429, replica_id=None, model="")
    usage_record_batch(events=[event], source=API)
    assert UsageEvent.objects.get().served_model_id is None
    assert not AttributionWindow.objects.exists()  # nothing ran on a GPU


def test_new_usage_marks_its_windows_and_hours_stale(ledger):
    # Resident from 12:59:59.5 to 13:00:01: two hourly windows on its replica.
    late = T0 + timedelta(minutes=59, seconds=59)
    usage_record_batch(events=[ledger.event("x", at=late)], source=API)
    windows = AttributionWindow.objects.order_by("start")
    assert [(w.replica_id, w.start, w.status) for w in windows] == [
        (ledger.replica.pk, T0, "pending"),
        (ledger.replica.pk, T0 + timedelta(hours=1), "pending"),
    ]
    assert sorted(DirtyHour.objects.values_list("hour", flat=True)) == [
        T0,
        T0 + timedelta(hours=1),
    ]


def test_timings_a_little_outside_the_request_are_pulled_inside(ledger):
    """vLLM's timings come from another clock: a few milliseconds of
    disagreement must not cost the event (the span itself is the gateway's)."""
    event = ledger.event("skew", first_token_at=T0 + timedelta(seconds=1, milliseconds=3))
    usage_record_batch(events=[event], source=API)
    assert UsageEvent.objects.get().first_token_at == T0 + timedelta(seconds=1)


def test_two_writers_creating_the_same_month_both_succeed(transactional_db):
    """Two gateways flushing at a month's first second create its partition
    at once: neither may fail (IF NOT EXISTS alone is not enough)."""
    import threading
    from datetime import date

    from django.db import connection

    from metering.partitions import usage_partitions_ensure

    month, errors, barrier = date(2031, 3, 1), [], threading.Barrier(4)

    def create():
        try:
            barrier.wait()
            usage_partitions_ensure(months=[month])
        except Exception as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert partition_name(month) in usage_partitions_list()
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {partition_name(month)}")


def test_a_batch_partly_recorded_before_adds_only_its_new_rows(ledger):
    """A replayed flush that carries new requests too: the recorded ones
    are duplicates and left as they were, the new ones land, and only the
    new ones re-open their windows."""
    usage_record_batch(events=[ledger.event("old")], source=API)
    AttributionWindow.objects.update(status="done")
    later = T0 + timedelta(hours=2)
    batch = [
        ledger.event("old", completion_tokens=99),
        ledger.event("new", at=later),
        ledger.event("new", at=later, completion_tokens=77),
    ]
    result = usage_record_batch(events=batch, source=API)
    assert result.statuses == ["duplicate", "accepted", "duplicate"]
    assert dict(UsageEvent.objects.values_list("request_id", "completion_tokens")) == {
        "old": 10,
        "new": 10,
    }
    assert UsageKey.objects.count() == 2
    pending = AttributionWindow.objects.filter(status="pending")
    assert [(w.replica_id, w.start) for w in pending] == [(ledger.replica.pk, later)]


def test_a_tenant_created_after_the_names_were_loaded_is_known(ledger):
    """Events are checked while they stream into the ledger, when the
    connection cannot look a name up: an unknown one restarts the batch
    with the names reloaded, so a new tenant's first usage is not refused."""
    usage_record_batch(events=[ledger.event("warm")], source=API)  # names loaded
    newcomer = make_tenant(name="Newcomer")
    event = ledger.event("first", tenant_id=None)
    event["tenant"] = newcomer.slug
    result = usage_record_batch(events=[ledger.event("before"), event], source=API)
    assert result.accepted == ["before", "first"]
    assert UsageEvent.objects.get(request_id="first").tenant_id == newcomer.pk


@pytest.mark.parametrize("orders", ["overlapping, in one order", "the same, in opposite orders"])
def test_writers_racing_with_the_same_requests_record_each_once(ledger_committed, orders):
    """Writers on connections of their own send batches that share
    requests, at once: every request lands once, is accepted by exactly one
    writer, and no writer fails. A key another writer holds sends a batch
    down the careful path; in opposite orders two writers deadlock, and the
    one PostgreSQL aborts takes the careful path too."""
    import threading

    from django.db import connection

    events = [ledger_committed.event(f"race-{n:03d}") for n in range(300)]
    if orders == "overlapping, in one order":
        shares = [events[0:200], events[100:300], events[50:250]]
    else:
        shares = [events, events[::-1]]
    accepted, errors, barrier = [], [], threading.Barrier(len(shares))

    def write(mine: list[dict]) -> None:
        try:
            barrier.wait()
            for start in range(0, len(mine), 100):
                result = usage_record_batch(events=mine[start : start + 100], source=API)
                accepted.extend(result.accepted)
        except Exception as exc:  # collected and asserted below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(share,)) for share in shares]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    recorded = list(UsageEvent.objects.values_list("request_id", flat=True))
    assert sorted(recorded) == sorted(accepted) == [e["request_id"] for e in events]
    assert UsageKey.objects.count() == len(events)


@pytest.mark.parametrize("events", ["one new", "none"])
def test_the_callers_transaction_keeps_its_lock_timeout(ledger, events):
    """The fast path waits at most 50 ms for a lock; the caller's own
    transaction (this test's) goes on with its usual setting."""
    from django.db import connection

    batch = [ledger.event("a")] if events == "one new" else []
    usage_record_batch(events=batch, source=API)
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0"


def test_a_migrated_database_has_its_partitions_from_last_month_to_three_ahead(db):
    """So the first events of a new deployment need no failed COPY (an
    ERROR in PostgreSQL's log) before ingestion creates their month."""
    from django.core.management import call_command
    from django.db import connection
    from django.utils import timezone

    from core.calendar import month_start, months_add

    months = [months_add(month_start(timezone.now()), n) for n in range(-1, 4)]
    with connection.cursor() as cursor:
        for month in months:
            cursor.execute(f'DROP TABLE IF EXISTS "{partition_name(month)}"')
    assert not {partition_name(m) for m in months} & set(usage_partitions_list())

    call_command("migrate", verbosity=0)

    assert {partition_name(m) for m in months} <= set(usage_partitions_list())
