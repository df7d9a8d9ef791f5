"""The raw ledger keeps its size: a month past the retention horizon is
exported to Parquet, read back and checked, its keys pruned and its
partition dropped, while its rollups stay; a file or a partition that is
not what was archived stops the drop; usage older than the horizon is
refused at ingest; a horizon too short for billing is refused."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import orjson
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from psycopg import sql

from metering import archive as archive_module
from metering.archive import ArchiveMismatch, archive_due, ledger_archive
from metering.choices import EventSource
from metering.jobs import metering_run
from metering.ledger import usage_record_batch
from metering.models import UsageArchive, UsageEvent, UsageKey, UsageRollup
from metering.partitions import partition_name, usage_partitions_list
from metering.retention import RetentionTooShort, horizon_start, retention_check
from metering.rollups import hours_mark_dirty, usage_rollups_refresh
from tenants.services import service_key_create
from tests.conftest import client_for_key

NOW = datetime(2026, 11, 28, 12, tzinfo=UTC)
OLD = datetime(2025, 6, 10, 9, tzinfo=UTC)  # 17 months before: past the 13-month horizon
OLD_MONTH = datetime(2025, 6, 1, tzinfo=UTC)
RECENT = datetime(2026, 11, 2, 9, tzinfo=UTC)


def _record(ledger, prefix: str, at: datetime, n: int) -> list[dict]:
    events = [
        ledger.event(
            f"{prefix}-{i}",
            tenant=ledger.a if i % 2 else ledger.b,
            at=at + timedelta(minutes=i),
            prompt_tokens=10 + i,
            cached_tokens=i % 3,
            completion_tokens=5 + i,
            ttft_ms=Decimal("12.345") + i,
        )
        for i in range(n)
    ]
    usage_record_batch(events=events, source=EventSource.API, now=at + timedelta(days=1))
    return events


def _rollups(month: datetime) -> list[tuple]:
    return list(
        UsageRollup.objects.filter(hour__gte=month, hour__lt=month + timedelta(days=31))
        .order_by("hour", "tenant_id")
        .values_list("hour", "tenant_id", "prompt_tokens", "completion_tokens", "requests_ok")
    )


@pytest.fixture
def archived(ledger_committed, tmp_path):
    """Forty events in an old month and ten this month, rolled up, then
    the ledger archived as of NOW."""
    ledger = ledger_committed
    old = _record(ledger, "old", OLD, 40)
    recent = _record(ledger, "new", RECENT, 10)
    metering_run(now=NOW)
    rollups_before = _rollups(OLD_MONTH)
    with connection.cursor() as cursor:
        cursor.execute(
            sql.SQL("SELECT request_id, ttft_ms, received_at FROM {}").format(
                sql.Identifier(partition_name(OLD_MONTH))
            )
        )
        rows_before = {r[0]: r[1:] for r in cursor.fetchall()}
    assert archive_due(now=NOW) == [OLD_MONTH]
    archives = ledger_archive(now=NOW, base_url=str(tmp_path))
    return {
        "old": old,
        "recent": recent,
        "archives": archives,
        "rollups_before": rollups_before,
        "rows_before": rows_before,
        "tmp": tmp_path,
    }


def test_a_month_past_the_horizon_is_archived_checked_pruned_and_dropped(archived):
    (archive,) = archived["archives"]
    old = archived["old"]
    assert archive.month == OLD_MONTH
    assert archive.rows == 40
    assert archive.prompt_tokens == sum(e["prompt_tokens"] for e in old)
    assert archive.cached_tokens == sum(e["cached_tokens"] for e in old)
    assert archive.completion_tokens == sum(e["completion_tokens"] for e in old)
    assert archive.verified_at is not None and archive.dropped_at is not None
    assert archive.keys_pruned == 40
    path = archived["tmp"] / f"metering_usageevent-{OLD_MONTH:%Y-%m}.parquet"
    assert archive.url == f"{archived['tmp']}/{path.name}" and path.stat().st_size == archive.bytes
    # The partition is gone, and its keys; this month's rows and keys are not.
    assert partition_name(OLD_MONTH) not in usage_partitions_list()
    assert not UsageKey.objects.filter(request_id__startswith="old-").exists()
    assert UsageKey.objects.filter(request_id__startswith="new-").count() == 10
    assert UsageEvent.objects.filter(request_id__startswith="new-").count() == 10
    # The old month's rollups stay, and a rebuild of its hours leaves them be.
    assert archived["rollups_before"] and _rollups(OLD_MONTH) == archived["rollups_before"]
    hours_mark_dirty(hours=[OLD])
    usage_rollups_refresh()
    assert _rollups(OLD_MONTH) == archived["rollups_before"]
    # Nothing more is due, and running again changes nothing.
    assert archive_due(now=NOW) == []
    assert ledger_archive(now=NOW, base_url=str(archived["tmp"])) == []


def test_the_file_holds_every_archived_event_exactly(archived):
    (archive,) = archived["archives"]
    table = pq.read_table(archive.url)
    assert table.num_rows == 40
    rows = {
        r["request_id"]: (r["ttft_ms"], r["received_at"], r["prompt_tokens"], r["tenant_id"])
        for r in table.to_pylist()
    }
    assert set(rows) == {e["request_id"] for e in archived["old"]}
    for event in archived["old"]:
        ttft, received, prompt, tenant = rows[event["request_id"]]
        assert (ttft, received, prompt, tenant) == (
            event["ttft_ms"],
            event["received_at"],
            event["prompt_tokens"],
            event["tenant_id"],
        )
        assert (ttft, received) == archived["rows_before"][event["request_id"]]
    assert str(table.schema.field("ttft_ms").type) == "decimal128(14, 3)"


def _first_steps(ledger, tmp_path) -> None:
    _record(ledger, "old", OLD, 5)


def test_a_file_that_does_not_read_back_as_written_stops_before_anything_is_dropped(
    ledger_committed, tmp_path, monkeypatch
):
    _first_steps(ledger_committed, tmp_path)
    verify = archive_module._verify

    def tampered(archive):  # the store hands back other bytes than were written
        with open(archive.url, "r+b") as fh:
            fh.seek(archive.bytes // 2)
            byte = fh.read(1)
            fh.seek(archive.bytes // 2)
            fh.write(bytes([byte[0] ^ 0xFF]))
        verify(archive)

    monkeypatch.setattr(archive_module, "_verify", tampered)
    with pytest.raises(ArchiveMismatch, match="read back as"):
        ledger_archive(now=NOW, base_url=str(tmp_path))
    archive = UsageArchive.objects.get(month=OLD_MONTH)
    assert (archive.verified_at, archive.dropped_at, archive.keys_pruned) == (None, None, 0)
    assert partition_name(OLD_MONTH) in usage_partitions_list()
    assert UsageKey.objects.filter(request_id__startswith="old-").count() == 5
    # Run again with a store that works: exported anew, and through.
    monkeypatch.setattr(archive_module, "_verify", verify)
    (done,) = ledger_archive(now=NOW, base_url=str(tmp_path))
    assert (done.rows, done.dropped_at is not None) == (5, True)


def test_usage_that_reached_the_partition_after_the_export_stops_the_drop(
    ledger_committed, tmp_path, monkeypatch
):
    _first_steps(ledger_committed, tmp_path)
    prune = archive_module._prune_keys

    def late_row_then_prune(archive, progress):
        # A writer whose clock is a year and a half slow: its horizon is too.
        _record(ledger_committed, "late", OLD, 1)
        prune(archive, progress)

    monkeypatch.setattr(archive_module, "_prune_keys", late_row_then_prune)
    with pytest.raises(ArchiveMismatch, match="usage arrived after the export"):
        ledger_archive(now=NOW, base_url=str(tmp_path))
    assert partition_name(OLD_MONTH) in usage_partitions_list()
    assert UsageArchive.objects.get(month=OLD_MONTH).dropped_at is None
    # The next run exports the month again, the late row with it.
    monkeypatch.setattr(archive_module, "_prune_keys", prune)
    (done,) = ledger_archive(now=NOW, base_url=str(tmp_path))
    assert (done.rows, done.dropped_at is not None) == (6, True)
    assert "late-0" in pq.read_table(done.url).column("request_id").to_pylist()


def test_usage_older_than_the_horizon_is_refused_at_ingest_naming_ended_at(ledger):
    _key, secret = service_key_create(name="edge")
    horizon = horizon_start(datetime.now(UTC))
    old = ledger.event("too-old", at=horizon - timedelta(days=2))
    body = {"events": [orjson.loads(orjson.dumps(old, default=str))]}
    response = client_for_key(secret).post("/api/v1/usage/events", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "events.0.ended_at"
    assert "retention horizon" in response.json()["results"][0]["reason"]
    assert not UsageEvent.objects.filter(request_id="too-old").exists()


def test_a_horizon_too_short_for_billing_is_refused_naming_both(settings):
    with pytest.raises(RetentionTooShort) as short:
        retention_check(3)
    message = str(short.value)
    assert "longest open billing period (1 month)" in message
    assert "late-usage window (BILLING_LATE_USAGE_PERIODS=3" in message
    assert "at least 4" in message
    assert retention_check(4) == 4
    with pytest.raises(CommandError, match="--months=2 is shorter"):
        call_command("ledger_archive", "--months", "2", "--dry-run")
    from django.core.checks import run_checks

    settings.METERING = {**settings.METERING, "RETENTION_MONTHS": 2}
    errors = [e for e in run_checks() if e.id == "metering.E001"]
    assert len(errors) == 1 and "METERING_RETENTION_MONTHS=2" in errors[0].msg


def test_the_command_lists_what_is_due_then_archives_it_with_progress(
    ledger_committed, tmp_path, capsys
):
    _record(ledger_committed, "old", OLD, 3)
    call_command("ledger_archive", "--dry-run")
    assert f"due (received before {horizon_start(datetime.now(UTC)):%Y-%m-%d}): 2025-06" in (
        capsys.readouterr().out
    )
    call_command("ledger_archive", "--to", str(tmp_path))
    out, err = capsys.readouterr()
    assert "2025-06: 3 events" in out and "partition dropped" in out
    assert "2025-06 exported" in err and "2025-06 keys pruned" in err  # the progress bars


def test_finance_sees_the_archives_page(ledger_committed, tmp_path, client):
    from tests.factories import make_finance_user

    _record(ledger_committed, "old", OLD, 3)
    (archive,) = ledger_archive(now=datetime.now(UTC), base_url=str(tmp_path))
    client.force_login(make_finance_user())
    page = client.get("/finance/archives/").content.decode()
    assert "2025-06" in page and archive.sha256[:12] in page and archive.url in page
    assert "Nothing archived yet" not in page
