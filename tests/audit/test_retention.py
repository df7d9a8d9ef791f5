"""The audit trail keeps the ledger's retention: months past the horizon
are written to Parquet, read back, recorded, and only then removed; the
rest stay, and the append-only guard is back on afterwards."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow.parquet as pq
import pytest
from django.db import connection, transaction
from django.db.utils import DatabaseError

from audit.models import AuditArchive, AuditEntry
from audit.retention import audit_archive

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 11, 20, tzinfo=UTC)


def entry_at(at: datetime, actor: str) -> int:
    """An entry as the trigger writes it, dated `at`: written here with the
    session's triggers off (a superuser's replica role), for no one else
    may insert an entry (tests/audit/test_trail_integrity.py)."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        cursor.execute(
            'INSERT INTO audit_auditentry (at, "table", row_id, action, before, after, '
            "actor, via, request, transaction_id) VALUES "
            "(%s, 'billing_costrate', '1', 'update', '{\"rate\": 1}', '{\"rate\": 2}', %s, "
            "'session', '', txid_current()) RETURNING id",
            [at, actor],
        )
        entry = cursor.fetchone()[0]
        cursor.execute("SET LOCAL session_replication_role = DEFAULT")
        return entry


def test_months_past_the_horizon_are_archived_verified_and_removed(settings, tmp_path):
    settings.METERING = {**settings.METERING, "RETENTION_MONTHS": 13}
    old = [entry_at(datetime(2025, 8, day, tzinfo=UTC), f"old-{day}") for day in (1, 15, 31)]
    older = entry_at(datetime(2025, 7, 2, tzinfo=UTC), "older")
    kept = entry_at(datetime(2025, 10, 1, tzinfo=UTC), "kept")  # the horizon: 2025-10-01

    archives = audit_archive(now=NOW, base_url=str(tmp_path))

    assert [(a.month.isoformat(), a.rows, a.first_id, a.last_id) for a in archives] == [
        ("2025-07-01", 1, older, older),
        ("2025-08-01", 3, old[0], old[-1]),
    ]
    august = tmp_path / "audit" / "audit-2025-08.parquet"
    table = pq.read_table(august)
    assert table["id"].to_pylist() == old
    assert table["actor"].to_pylist() == ["old-1", "old-15", "old-31"]
    assert table["after"].to_pylist() == ['{"rate": 2}'] * 3
    assert not AuditEntry.objects.filter(id__in=[*old, older]).exists()
    assert AuditEntry.objects.filter(id=kept).exists()
    assert audit_archive(now=NOW, base_url=str(tmp_path)) == []  # nothing left due
    assert AuditArchive.objects.count() == 2

    with (  # the guard is back on
        pytest.raises(DatabaseError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM audit_auditentry WHERE id = %s", [kept])
