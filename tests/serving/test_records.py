"""The interim record sink: every field lands, a repeated request id is
skipped, and a bad row fails the batch without writing any of it."""

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import IntegrityError

from serving.models import RequestRecord
from serving.records import CompletedRequest, request_record_sink
from tests.factories import make_key, make_tenant

pytestmark = pytest.mark.django_db
T0 = datetime(2026, 11, 1, 12, tzinfo=UTC)


def record(request_id: str, tenant, key, **fields) -> CompletedRequest:
    values = {
        "request_id": request_id,
        "tenant_id": tenant.pk,
        "api_key_id": key.pk,
        "model": "m",
        "received_at": T0,
        "ended_at": T0 + timedelta(seconds=1),
        "status": "ok",
        "http_status": 200,
        **fields,
    }
    return CompletedRequest(**values)


def test_fields_land_and_duplicates_are_skipped():
    tenant = make_tenant()
    key, _ = make_key(tenant)
    first = record(
        "r1",
        tenant,
        key,
        prompt_tokens=12,
        cached_tokens=4,
        completion_tokens=7,
        stream=True,
        priority=10,
        queue_ms=Decimal("1.250"),
        sent_at=T0 + timedelta(milliseconds=2),
        error="x" * 400,
    )
    request_record_sink([first, record("r2", tenant, key)])
    request_record_sink(
        [record("r1", tenant, key, completion_tokens=999), record("r3", tenant, key)]
    )
    assert sorted(RequestRecord.objects.values_list("request_id", flat=True)) == ["r1", "r2", "r3"]
    row = RequestRecord.objects.get(request_id="r1")
    assert (row.prompt_tokens, row.cached_tokens, row.completion_tokens) == (12, 4, 7)
    assert row.stream and row.priority == 10 and row.queue_ms == Decimal("1.250")
    assert row.sent_at == T0 + timedelta(milliseconds=2)
    assert len(row.error) == 300


def test_a_bad_row_fails_the_whole_batch():
    tenant = make_tenant()
    key, _ = make_key(tenant)
    with pytest.raises(IntegrityError):
        request_record_sink(
            [record("ok", tenant, key), record("bad", tenant, key, tenant_id=10**9)]
        )
    assert not RequestRecord.objects.exists()


def test_database_errors_surface_as_djangos_for_retry_decisions(monkeypatch):
    """The recorder retries Django's OperationalError (database away) and
    dead-letters other errors: the COPY path must raise Django's classes."""
    import psycopg
    from django.db import OperationalError

    tenant = make_tenant()
    key, _ = make_key(tenant)

    def refuse(*args, **kwargs):
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Cursor, "copy", refuse)
    with pytest.raises(OperationalError):
        request_record_sink([record("r", tenant, key)])
