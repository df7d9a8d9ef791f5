"""The trail against whoever holds a database role: an entry made up by
hand is refused, a TRUNCATE and a COPY are recorded as the actor's, every
committed entry is in the hash chain and `audit_verify` names an entry
edited, deleted or slipped in; and once `audit_secure` gives the trail an
owner of its own, the app's role can do none of that, not even by disabling
the guards, and its schema changes are entries."""

from __future__ import annotations

import secrets
import subprocess
from decimal import Decimal

import psycopg
import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import DatabaseError, connection, transaction

from audit.chain import chain_verify
from audit.context import Actor, acting_as
from audit.models import AuditEntry
from audit.owner import trail_secure
from billing.models import FxRate
from core.db_copy import instances_create
from tests.own_postgres import _bin_dir

INSERT = (
    'INSERT INTO audit_auditentry (at, "table", row_id, action, actor, via, request, '
    "transaction_id) VALUES (now(), 'billing_fxrate', '1', 'insert', 'made up', 'session', '', 1)"
)


def fx_rate(day: int, rate: str = "1.08") -> FxRate:
    from datetime import date

    return FxRate(base="EUR", quote="USD", date=date(2026, 11, day), rate=Decimal(rate))


@pytest.mark.django_db
def test_an_entry_made_up_by_hand_is_refused():
    with (
        pytest.raises(DatabaseError, match="written by the audit trail's triggers only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(INSERT)
    assert not AuditEntry.objects.filter(actor="made up").exists()


@pytest.mark.django_db
def test_rows_written_by_copy_are_recorded_as_the_actor():
    with acting_as(Actor(name="finance-bot", via="job", request="task 7")):
        instances_create(FxRate, [fx_rate(2), fx_rate(3)], connection)
    entries = AuditEntry.objects.filter(table="billing_fxrate", action="insert")
    assert [(e.actor, e.via, e.request) for e in entries] == [("finance-bot", "job", "task 7")] * 2


@pytest.mark.django_db(transaction=True)
def test_a_watched_table_emptied_by_truncate_is_one_entry_with_its_row_count():
    FxRate.objects.bulk_create([fx_rate(2), fx_rate(3), fx_rate(4)])
    with acting_as(Actor(name="ops", via="command")), connection.cursor() as cursor:
        cursor.execute("TRUNCATE billing_fxrate")
    entry = AuditEntry.objects.get(table="billing_fxrate", action="truncate")
    assert (entry.actor, entry.via, entry.before, entry.row_id) == (
        "ops",
        "command",
        {"rows": 3},
        "",
    )
    assert chain_verify().intact


def _tamper(*statements: str | tuple[str, list]) -> None:
    """A superuser's edits behind every trigger (the replica role)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL session_replication_role = replica")
        for statement in statements:
            text, params = statement if isinstance(statement, tuple) else (statement, [])
            cursor.execute(text, params)


@pytest.mark.django_db(transaction=True)
def test_the_chain_names_an_entry_edited_deleted_or_written_around_it(capsys):
    for day in range(2, 8):
        FxRate.objects.create(
            **{k: getattr(fx_rate(day), k) for k in ("base", "quote", "date", "rate")}
        )
    ids = list(AuditEntry.objects.order_by("id").values_list("id", flat=True))
    assert len(ids) == 6

    call_command("audit_verify")
    printed = capsys.readouterr().out
    assert "6 links" in printed and printed.rstrip().endswith("intact")
    head = chain_verify()
    assert (head.links, head.head_seq, len(head.head_hash)) == (6, 6, 64)

    _tamper(
        ("UPDATE audit_auditentry SET actor = 'someone else' WHERE id = %s", [ids[1]]),
        ("DELETE FROM audit_auditentry WHERE id = %s", [ids[3]]),
        INSERT,
    )
    report = chain_verify()
    slipped = AuditEntry.objects.get(actor="made up").pk
    assert report.problems == [
        f"entry {ids[1]} (link 2) is not what was linked: changed since",
        f"entry {ids[3]} (link 4) was deleted, not archived",
        f"entry {slipped} is outside the chain (written around it)",
    ]
    with pytest.raises(CommandError, match="3 problems"):
        call_command("audit_verify")

    # A chain rewritten from link 1 on (every link made again) passes on its
    # own, not against a head written down before.
    _tamper(
        ("DELETE FROM audit_auditentry WHERE id = ANY(%s)", [[ids[3], slipped]]),
        "DELETE FROM audit_auditlink",
        "DO $$ DECLARE e audit_auditentry; h bytea; n bigint := 0; BEGIN "
        "FOR e IN SELECT * FROM audit_auditentry ORDER BY id LOOP n := n + 1; "
        "h := audit_link_hash(h, e); INSERT INTO audit_auditlink VALUES (n, e.id, h); "
        "END LOOP; END $$",
    )
    assert chain_verify().intact
    rewritten = chain_verify(expect=(head.head_seq, head.head_hash))
    assert rewritten.problems == [
        f"link 6 is not the {head.head_hash} written down: the chain was rewritten"
    ]
    with pytest.raises(CommandError, match="--expect: '6' is not SEQ:HASH"):
        call_command("audit_verify", expect="6")


# --- the trail with an owner of its own ---------------------------------------


@pytest.fixture
def secured():
    """A copy of the test database on the same server, its app tables
    owned by an app role of its own (as a deployment's are), the trail
    given to an owner by `trail_secure`; yields (app's connection,
    superuser's connection). Dropped afterwards, roles and all."""
    tag = secrets.token_hex(4)
    name, app, owner = f"gl_secured_{tag}", f"gl_app_{tag}", f"gl_audit_{tag}"
    source = connection.settings_dict
    server = [
        "-h",
        source["HOST"] or "127.0.0.1",
        "-p",
        str(source["PORT"] or 5432),
        "-U",
        "postgres",
    ]
    admin = psycopg.connect(
        host="127.0.0.1",
        port=source["PORT"] or 5432,
        user="postgres",
        dbname="postgres",
        autocommit=True,
    )
    admin.execute(f'CREATE DATABASE "{name}"')
    admin.execute(f'CREATE ROLE "{app}" LOGIN')
    bins = _bin_dir()
    dump = subprocess.run(
        [str(bins / "pg_dump"), "-Fc", *server, source["NAME"]],
        check=True,
        capture_output=True,
        timeout=120,
    )
    subprocess.run(
        [str(bins / "pg_restore"), *server, "-d", name, "--no-owner"],
        input=dump.stdout,
        check=True,
        capture_output=True,
        timeout=120,
    )
    superuser = psycopg.connect(
        host="127.0.0.1", port=source["PORT"] or 5432, user="postgres", dbname=name, autocommit=True
    )
    with superuser.transaction():
        for (table,) in superuser.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        ).fetchall():
            superuser.execute(f'ALTER TABLE "{table}" OWNER TO "{app}"')
        superuser.execute(f'GRANT CREATE ON SCHEMA public TO "{app}"')  # it runs migrations
        with superuser.cursor() as cursor:
            trail_secure(cursor, app_role=app, owner=owner)
    as_app = psycopg.connect(
        host="127.0.0.1", port=source["PORT"] or 5432, user=app, dbname=name, autocommit=True
    )
    try:
        yield as_app, superuser
    finally:
        as_app.close()
        superuser.close()
        admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        admin.execute(f'DROP ROLE "{app}"')
        admin.execute(f'DROP ROLE "{owner}"')
        admin.close()


def _refused(conn, statement: str, match: str) -> None:
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match=match):
        conn.execute(statement)


@pytest.mark.django_db
def test_once_secured_the_apps_role_reads_the_trail_and_cannot_change_it(secured):
    app, superuser = secured
    count = superuser.execute("SELECT count(*) FROM audit_auditentry").fetchone()[0]
    tenant = app.execute(
        "INSERT INTO tenants_tenant (name, slug, tier, billing_currency, status, created_at) "
        "VALUES ('Hooli', 'hooli', 'shared', 'USD', 'active', now()) RETURNING id"
    ).fetchone()[0]
    # Its writes are recorded, by the owner's functions, and linked.
    actor, action = app.execute(
        "SELECT actor, action FROM audit_auditentry "
        "WHERE \"table\" = 'tenants_tenant' AND row_id = %s",
        [str(tenant)],
    ).fetchone()
    assert (actor, action) == (f"database:{app.info.user}", "insert")

    for statement, match in [
        (INSERT, "permission denied for table audit_auditentry"),
        ("UPDATE audit_auditentry SET actor = 'x'", "permission denied"),
        ("DELETE FROM audit_auditentry", "permission denied"),
        ("TRUNCATE audit_auditentry", "permission denied"),
        ("DELETE FROM audit_auditlink", "permission denied"),
        (
            "INSERT INTO audit_auditarchive (month, url, rows, sha256, archived_at) "
            "VALUES ('2020-01-01', 'x', 0, 'x', now())",
            "permission denied",
        ),
        ("ALTER TABLE audit_auditentry DISABLE TRIGGER audit_append_only", "must be owner"),
        ("DROP TABLE audit_auditlink", "must be owner"),
        (
            "CREATE OR REPLACE FUNCTION audit_record() RETURNS trigger LANGUAGE plpgsql "
            "AS $$ BEGIN RETURN NULL; END $$",
            "must be owner",
        ),
        ("SET session_replication_role = replica", "permission denied"),
        (
            "SELECT audit_retire(date_trunc('month', now())::date, 'x', 'x', 0, 0, 0)",
            "kept a month at least",
        ),
    ]:
        _refused(app, statement, match)

    # A look-alike table of its own never takes the entries.
    app.execute("CREATE TEMP TABLE audit_auditentry (LIKE public.audit_auditentry)")
    app.execute("UPDATE tenants_tenant SET name = 'Hooli Inc' WHERE id = %s", [tenant])
    assert app.execute("SELECT count(*) FROM pg_temp.audit_auditentry").fetchone()[0] == 0
    # Turning a watched table's trigger off is itself an entry.
    app.execute("ALTER TABLE tenants_tenant DISABLE TRIGGER audit_record")
    schema = app.execute(
        "SELECT after FROM public.audit_auditentry WHERE action = 'schema' ORDER BY id DESC LIMIT 1"
    ).fetchone()[0]
    assert schema == {"command": "ALTER TABLE", "object": "public.tenants_tenant", "type": "table"}
    app.execute("TRUNCATE tenants_tenant CASCADE")
    assert superuser.execute(
        "SELECT before FROM audit_auditentry "
        "WHERE action = 'truncate' AND \"table\" = 'tenants_tenant'"
    ).fetchone()[0] == {"rows": 1}

    after = superuser.execute("SELECT count(*) FROM audit_auditentry").fetchone()[0]
    assert after > count + 3
    with superuser.cursor() as cursor:
        assert chain_verify(cursor).problems == []


@pytest.mark.django_db
def test_once_secured_the_apps_role_retires_an_old_month_only_on_the_record(secured):
    app, superuser = secured
    with superuser.transaction():  # an entry of January 2025, linked as the trigger links
        superuser.execute("SET LOCAL session_replication_role = replica")
        old = superuser.execute(
            'INSERT INTO audit_auditentry (at, "table", row_id, action, actor, via, request, '
            "transaction_id) VALUES ('2025-01-10T12:00Z', 'billing_fxrate', '1', 'insert', "
            "'finance', 'session', '', 1) RETURNING id"
        ).fetchone()[0]
        superuser.execute(
            "INSERT INTO audit_auditlink (seq, entry_id, hash) "
            "SELECT coalesce(max(l.seq), 0) + 1, e.id, audit_link_hash("
            "(SELECT hash FROM audit_auditlink ORDER BY seq DESC LIMIT 1), e) "
            "FROM audit_auditentry e LEFT JOIN audit_auditlink l ON true WHERE e.id = %s "
            "GROUP BY e.id, e.*",
            [old],
        )
    with pytest.raises(psycopg.errors.RaiseException, match="1 entries found to remove, not the 2"):
        app.execute(  # the count must be the month's, or nothing is removed
            "SELECT audit_retire('2025-01-01', 'file:///a.parquet', 'ab', %s, %s, 2)", [old, old]
        )
    removed = app.execute(
        "SELECT audit_retire('2025-01-01', 'file:///a.parquet', 'ab', %s, %s, 1)", [old, old]
    ).fetchone()[0]
    assert removed == 1
    assert app.execute("SELECT url, rows FROM audit_auditarchive").fetchall() == [
        ("file:///a.parquet", 1)
    ]
    assert superuser.execute(
        "SELECT count(*) FROM audit_auditentry WHERE id = %s", [old]
    ).fetchone() == (0,)
    with superuser.cursor() as cursor:  # its link stays; the archive accounts for the entry
        assert chain_verify(cursor).problems == []
