"""The PostgreSQL side of the audit trail: one trigger function recording
any audited table's row changes, and the guards that make the entries
append-only. Installed by migrations (RunPython), idempotent."""

from __future__ import annotations

from collections.abc import Iterable

from psycopg import sql

from audit.tracked import TRACKED, Tracked

ENTRY_TABLE = "audit_auditentry"
TRIGGER = "audit_record"
# The actor context a process or request sets (audit.context); a write
# made without one (psql, another program) is recorded as the database
# role that made it.
RECORD_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_record() RETURNS trigger LANGUAGE plpgsql AS $$
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
  INSERT INTO audit_auditentry
    (at, "table", row_id, action, changed, before, after, tenant_id,
     actor, actor_user_id, via, request, transaction_id)
  VALUES (
    now(), TG_TABLE_NAME, coalesce(one_row ->> 'id', ''), lower(TG_OP), changed_columns,
    before_row, after_row, tenant,
    coalesce(nullif(current_setting('gpu_ledger.actor', true), ''), 'database:' || session_user),
    nullif(current_setting('gpu_ledger.actor_user_id', true), '')::bigint,
    coalesce(nullif(current_setting('gpu_ledger.via', true), ''), 'database'),
    left(coalesce(current_setting('gpu_ledger.request', true), ''), 300),
    txid_current()
  );
  RETURN NULL;
END $$;
"""
APPEND_ONLY = """
CREATE OR REPLACE FUNCTION audit_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'audit entries are append-only: % refused', TG_OP
    USING ERRCODE = 'insufficient_privilege';
END $$;
DROP TRIGGER IF EXISTS audit_append_only ON audit_auditentry;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit_auditentry
  FOR EACH ROW EXECUTE FUNCTION audit_refuse();
DROP TRIGGER IF EXISTS audit_no_truncate ON audit_auditentry;
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_auditentry
  FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse();
"""
# Only the retention job removes entries: a month already written to its
# verified archive, with this guard lifted inside that one transaction.
GUARD = "audit_append_only"


def _literal_array(values: Iterable[str]) -> str:
    return "{" + ",".join(values) + "}"


def trigger_sql(tracked: Tracked) -> sql.Composed:
    return sql.SQL(
        "DROP TRIGGER IF EXISTS {trigger} ON {table}; "
        "CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {table} "
        "FOR EACH ROW EXECUTE FUNCTION audit_record({tenant}, {ignored}, {redacted})"
    ).format(
        trigger=sql.Identifier(TRIGGER),
        table=sql.Identifier(tracked.table),
        tenant=sql.Literal(tracked.tenant),
        ignored=sql.Literal(_literal_array(tracked.ignored)),
        redacted=sql.Literal(_literal_array(tracked.redacted)),
    )


def triggers_install(schema_editor, tracked: Iterable[Tracked] = TRACKED) -> None:
    """The functions, the guards and a trigger on every tracked table that
    exists yet (a later migration, after the app that makes a table,
    installs its trigger: tables_without_trigger finds one forgotten)."""
    cursor = schema_editor.connection.cursor()
    cursor.execute(RECORD_FUNCTION)
    cursor.execute(APPEND_ONLY)
    for table in tracked:
        cursor.execute("SELECT to_regclass(%s)", [table.table])
        if cursor.fetchone()[0] is not None:
            cursor.execute(trigger_sql(table))


def triggers_uninstall(schema_editor, tracked: Iterable[Tracked] = TRACKED) -> None:
    """What triggers_install did, undone (a migration unapplied): no table
    keeps a trigger that writes to a table that is gone."""
    cursor = schema_editor.connection.cursor()
    for table in tracked:
        cursor.execute("SELECT to_regclass(%s)", [table.table])
        if cursor.fetchone()[0] is not None:
            cursor.execute(
                sql.SQL("DROP TRIGGER IF EXISTS {} ON {}").format(
                    sql.Identifier(TRIGGER), sql.Identifier(table.table)
                )
            )


def tables_without_trigger(connection) -> list[str]:
    """Tracked tables that lack their trigger (a missing migration)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
            "WHERE t.tgname = %s",
            [TRIGGER],
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
