"""The PostgreSQL side of the audit trail: one trigger function recording
any audited table's row changes, and the guards that make the entries
append-only. Installed by migrations (RunPython), idempotent."""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql

from audit.tracked import TRACKED, Tracked

ENTRY_TABLE = "audit_auditentry"
LINK_TABLE = "audit_auditlink"
TRIGGER = "audit_record"
TRUNCATE_TRIGGER = "audit_truncate"


# The one INSERT every recording function makes. The actor is the context
# a process or request sets (audit.context); a write made without one (psql,
# another program) is recorded as the database role that made it. A table
# outside the trail's schema is named with its schema (a look-alike table
# elsewhere is never taken for a watched one).
ENTRY_INSERT = """
  INSERT INTO audit_auditentry
    (at, "table", row_id, action, changed, before, after, tenant_id,
     actor, actor_user_id, via, request, transaction_id)
  VALUES (
    now(), {table}, {row_values},
    coalesce(nullif(current_setting('gpu_ledger.actor', true), ''), 'database:' || session_user),
    nullif(current_setting('gpu_ledger.actor_user_id', true), '')::bigint,
    coalesce(nullif(current_setting('gpu_ledger.via', true), ''), 'database'),
    left(coalesce(current_setting('gpu_ledger.request', true), ''), 300),
    txid_current()
  );"""


TRIGGER_TABLE = """CASE WHEN TG_TABLE_SCHEMA = current_schema() THEN TG_TABLE_NAME
         ELSE left(TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME, 63) END"""


def entry_insert(row_values: str, *, table: str = TRIGGER_TABLE) -> str:
    """ENTRY_INSERT for a function: the entry's table, and its row id,
    action, changed, before, after and tenant (SQL expressions)."""
    return ENTRY_INSERT.replace("{table}", table).replace("{row_values}", row_values)


RECORD_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_record() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
  tenant_source text := TG_ARGV[0];
  ignored text[] := TG_ARGV[1]::text[];
  redacted text[] := TG_ARGV[2]::text[];
  before_row jsonb;
  after_row jsonb;
  one_row jsonb;
  changed_columns text[];
  tenant bigint;
  parent text[];
BEGIN
  IF TG_OP <> 'INSERT' THEN before_row := to_jsonb(OLD) - redacted; END IF;
  IF TG_OP <> 'DELETE' THEN after_row := to_jsonb(NEW) - redacted; END IF;
  one_row := coalesce(after_row, before_row);
  IF TG_OP = 'UPDATE' THEN
    -- A redacted column's change is named, never its values.
    SELECT array_agg(n.key ORDER BY n.key) INTO changed_columns
      FROM jsonb_each(to_jsonb(NEW)) AS n
     WHERE n.value IS DISTINCT FROM to_jsonb(OLD) -> n.key AND NOT (n.key = ANY (ignored));
    IF changed_columns IS NULL THEN RETURN NULL; END IF;
  END IF;
  IF tenant_source LIKE '%.%' THEN
    parent := string_to_array(tenant_source, '.');
    EXECUTE format('SELECT tenant_id FROM %I WHERE id = $1', parent[1])
      INTO tenant USING (one_row ->> parent[2])::bigint;
  ELSIF tenant_source <> '' THEN
    tenant := (one_row ->> tenant_source)::bigint;
  END IF;
  {insert}
  RETURN NULL;
END $$;
""".replace(
    "{insert}",
    entry_insert(
        "coalesce(one_row ->> 'id', ''), lower(TG_OP), "
        "changed_columns, before_row, after_row, tenant"
    ),
)
# A watched table emptied at once (TRUNCATE) is one entry naming how many
# rows went; row triggers never see it.
TRUNCATE_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_record_truncate() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
  removed bigint;
BEGIN
  EXECUTE format('SELECT count(*) FROM %I.%I', TG_TABLE_SCHEMA, TG_TABLE_NAME) INTO removed;
  {insert}
  RETURN NULL;
END $$;
""".replace(
    "{insert}",
    entry_insert("'', 'truncate', NULL, jsonb_build_object('rows', removed), NULL, NULL"),
)
# Entries are only ever added, and only by the functions above (a trigger's
# own insert runs one level down: pg_trigger_depth() 2), or by the trail's
# owner (audit.owner): an INSERT of a made-up entry is refused. Retention
# (audit_retire) is the one DELETE: a whole month ended a month ago at
# least, recorded with its archive's address and digest in the same
# transaction (the archive rows are written there only, once secured).
APPEND_ONLY = """
CREATE OR REPLACE FUNCTION audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'DELETE' AND TG_TABLE_NAME = 'audit_auditentry'
     AND current_setting('gpu_ledger.audit_retiring', true) = 'on' THEN
    RETURN OLD;
  END IF;
  RAISE EXCEPTION 'audit entries are append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE OR REPLACE FUNCTION audit_insert_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF pg_trigger_depth() < 2 AND current_user = session_user THEN
    RAISE EXCEPTION 'audit entries are written by the audit trail''s triggers only: INSERT refused'
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  RETURN NEW;
END $$;
DROP TRIGGER IF EXISTS audit_append_only ON audit_auditentry;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
  FOR EACH ROW EXECUTE FUNCTION audit_refuse();
DROP TRIGGER IF EXISTS audit_no_truncate ON audit_auditentry;
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_auditentry
  FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse();
DROP TRIGGER IF EXISTS audit_insert_guard ON audit_auditentry;
CREATE TRIGGER audit_insert_guard BEFORE INSERT ON audit_auditentry
  FOR EACH ROW EXECUTE FUNCTION audit_insert_guard();
CREATE OR REPLACE FUNCTION audit_retire(
  archived_month date, archive_url text, archive_sha256 text,
  first_entry bigint, last_entry bigint, entries bigint
) RETURNS bigint LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
  month_start timestamptz := archived_month::timestamp AT TIME ZONE 'UTC';
  month_end timestamptz := (archived_month + interval '1 month') AT TIME ZONE 'UTC';
  removed bigint;
BEGIN
  IF month_end > now() - interval '1 month' THEN
    RAISE EXCEPTION 'audit entries are kept a month at least: % refused', archived_month
      USING ERRCODE = 'insufficient_privilege';
  END IF;
  INSERT INTO audit_auditarchive (month, url, rows, first_id, last_id, sha256, archived_at)
  VALUES (archived_month, archive_url, entries, first_entry, last_entry, archive_sha256, now())
  ON CONFLICT (month) DO UPDATE SET url = EXCLUDED.url, rows = EXCLUDED.rows,
    first_id = EXCLUDED.first_id, last_id = EXCLUDED.last_id, sha256 = EXCLUDED.sha256;
  PERFORM set_config('gpu_ledger.audit_retiring', 'on', true);
  DELETE FROM audit_auditentry
   WHERE id BETWEEN first_entry AND last_entry AND at >= month_start AND at < month_end;
  GET DIAGNOSTICS removed = ROW_COUNT;
  PERFORM set_config('gpu_ledger.audit_retiring', '', true);
  IF removed <> entries THEN
    RAISE EXCEPTION 'audit month %: % entries found to remove, not the % archived',
      archived_month, removed, entries;
  END IF;
  RETURN removed;
END $$;
"""
FUNCTIONS = (
    "audit_record()",
    "audit_record_truncate()",
    "audit_refuse()",
    "audit_insert_guard()",
    "audit_retire(date, text, text, bigint, bigint, bigint)",
)


def _literal_array(values: Iterable[str]) -> str:
    return "{" + ",".join(values) + "}"


def trigger_sql(tracked: Tracked) -> sql.Composed:
    return sql.SQL(
        "DROP TRIGGER IF EXISTS {trigger} ON {table}; "
        "CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION audit_record({tenant}, {ignored}, {redacted}); "
        "DROP TRIGGER IF EXISTS {truncate} ON {table}; "
        "CREATE TRIGGER {truncate} BEFORE TRUNCATE ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION audit_record_truncate()"
    ).format(
        trigger=sql.Identifier(TRIGGER),
        truncate=sql.Identifier(TRUNCATE_TRIGGER),
        table=sql.Identifier(tracked.table),
        tenant=sql.Literal(tracked.tenant),
        ignored=sql.Literal(_literal_array(tracked.ignored)),
        redacted=sql.Literal(_literal_array(tracked.redacted)),
    )


def _exists(cursor, table: str) -> bool:
    cursor.execute("SELECT to_regclass(%s)", [table])
    return cursor.fetchone()[0] is not None


def trail_owned_here(cursor) -> bool:
    """May this connection (re)write the trail's functions: nobody owns them
    yet, or its role does. Once the trail has an owner of its own
    (audit.owner), the app's role installs only its tables' triggers."""
    cursor.execute(
        "SELECT pg_has_role(current_user, p.proowner, 'USAGE') FROM pg_proc p "
        "WHERE p.proname = 'audit_record' AND p.pronamespace = current_schema()::regnamespace"
    )
    row = cursor.fetchone()
    return row is None or row[0]


def functions_install(cursor) -> None:
    """The trail's functions and guards, each running with the trail's own
    schema first and temporary tables last (a function that runs as the
    trail's owner never writes to a look-alike table)."""
    from audit import chain

    cursor.execute(RECORD_FUNCTION)
    cursor.execute(TRUNCATE_FUNCTION)
    cursor.execute(APPEND_ONLY)
    functions = FUNCTIONS
    if _exists(cursor, LINK_TABLE):
        cursor.execute(chain.HASH_FUNCTION)
        cursor.execute(chain.LINK_SQL)
        functions += chain.FUNCTIONS
    cursor.execute("SELECT current_schema()")
    schema = sql.Identifier(cursor.fetchone()[0])
    for function in functions:
        cursor.execute(
            sql.SQL("ALTER FUNCTION {} SET search_path = {}, pg_catalog, pg_temp").format(
                sql.SQL(function), schema
            )
        )


def triggers_install(schema_editor, tracked: Iterable[Tracked] = TRACKED) -> None:
    """The functions, the guards and the triggers on every tracked table
    that exists yet (a later migration, after the app that makes a table,
    installs its trigger: tables_without_trigger finds one forgotten)."""
    cursor = schema_editor.connection.cursor()
    if trail_owned_here(cursor):
        functions_install(cursor)
    for table in tracked:
        if _exists(cursor, table.table):
            cursor.execute(trigger_sql(table))


def triggers_uninstall(schema_editor, tracked: Iterable[Tracked] = TRACKED) -> None:
    """What triggers_install did, undone (a migration unapplied): no table
    keeps a trigger that writes to a table that is gone."""
    cursor = schema_editor.connection.cursor()
    for table in tracked:
        if _exists(cursor, table.table):
            for trigger in (TRIGGER, TRUNCATE_TRIGGER):
                cursor.execute(
                    sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                        sql.Identifier(trigger), sql.Identifier(table.table)
                    )
                )


def tables_without_trigger(connection) -> list[str]:
    """Tracked tables that lack a trigger of theirs (a missing migration)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = ANY(%s) GROUP BY c.relname HAVING count(*) = 2",
            [[TRIGGER, TRUNCATE_TRIGGER]],
        )
        have = {name for (name,) in cursor.fetchall()}
    return [t.table for t in TRACKED if t.table not in have]


def tables_joined(tables: tuple[str, ...]):
    """A migration's operation for tables joining the audit trail: every
    tracked table's trigger (re)installed; undone, those of `tables` removed."""
    from django.db import migrations

    def install(apps, schema_editor):
        triggers_install(schema_editor)

    def uninstall(apps, schema_editor):
        triggers_uninstall(schema_editor, [t for t in TRACKED if t.table in tables])

    return migrations.RunPython(install, uninstall)
