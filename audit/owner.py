"""The audit trail given an owner of its own, apart from the app's role:
`manage.py audit_secure --app-role ROLE`, run once by a superuser (and
again after a release that changes the trail's functions).

Afterwards the app's role may read the trail and nothing else: it cannot
insert, change, delete or empty an entry, a link or an archive row, nor
alter, drop or disable anything of the trail's (it owns none of it). Its
writes to watched tables are still recorded, by the trail's functions
running as the owner. It may retire a month (audit_retire, which records
the archive it names). Schema changes by anyone (a trigger disabled or
dropped on a watched table, a look-alike table) are entries of their own,
by event triggers only a superuser can remove.

What it does not stop: a superuser, or the owner role itself. The hash
chain (audit.chain) shows their edits to anyone holding a head written
down earlier (`audit_verify --expect`)."""

from __future__ import annotations

from psycopg import sql

from audit.chain import FUNCTIONS as CHAIN_FUNCTIONS
from audit.tracked import TRACKED
from audit.triggers import ENTRY_TABLE, FUNCTIONS, LINK_TABLE, entry_insert, functions_install

OWNER_ROLE = "gpu_ledger_audit"
OWNED_TABLES = (ENTRY_TABLE, LINK_TABLE, "audit_auditarchive")
SCHEMA_FUNCTIONS = ("audit_schema_change()", "audit_schema_drop()")
RETIRE = "audit_retire(date, text, text, bigint, bigint, bigint)"
_SCHEMA_ENTRY = (
    "'', 'schema', NULL, NULL, "
    "jsonb_build_object('command', {command}, 'object', c.object_identity, 'type', c.object_type), "
    "NULL"
)
# Every schema change but a temporary table's (a COPY's staging table).
SCHEMA_EVENTS = """
CREATE OR REPLACE FUNCTION audit_schema_change() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT * FROM pg_event_trigger_ddl_commands()
            WHERE coalesce(schema_name, '') NOT LIKE 'pg_temp%' LOOP
    {change}
  END LOOP;
END $$;
CREATE OR REPLACE FUNCTION audit_schema_drop() RETURNS event_trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
  c record;
BEGIN
  FOR c IN SELECT * FROM pg_event_trigger_dropped_objects()
            WHERE original AND NOT is_temporary LOOP
    {drop}
  END LOOP;
END $$;
""".replace(
    "{change}",
    entry_insert(
        _SCHEMA_ENTRY.replace("{command}", "c.command_tag"),
        table="left(coalesce(c.object_identity, ''), 63)",
    ),
).replace(
    "{drop}",
    entry_insert(
        _SCHEMA_ENTRY.replace("{command}", "tg_tag"),
        table="left(coalesce(c.object_identity, ''), 63)",
    ),
)
SCHEMA_TRIGGERS = """
DROP EVENT TRIGGER IF EXISTS audit_schema_change;
CREATE EVENT TRIGGER audit_schema_change ON ddl_command_end
  EXECUTE FUNCTION audit_schema_change();
DROP EVENT TRIGGER IF EXISTS audit_schema_drop;
CREATE EVENT TRIGGER audit_schema_drop ON sql_drop EXECUTE FUNCTION audit_schema_drop();
"""


def trail_secure(cursor, *, app_role: str, owner: str = OWNER_ROLE) -> None:
    """Give the trail to `owner` (made, without a login, if there is none)
    and leave `app_role` reading it. `cursor`: a superuser's, on the app's
    database. Idempotent."""
    owner_id, app = sql.Identifier(owner), sql.Identifier(app_role)
    # Links made as each statement ends: no table of the trail altered below
    # with entries pending (a run again records its own schema changes).
    cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
    cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [owner])
    if cursor.fetchone() is None:
        cursor.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(owner_id))
    functions_install(cursor)  # the latest definitions, as the superuser
    cursor.execute("SELECT current_schema()")
    schema = sql.Identifier(cursor.fetchone()[0])
    cursor.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, owner_id))
    for name in OWNED_TABLES:
        table = sql.Identifier(name)
        cursor.execute(sql.SQL("ALTER TABLE {} OWNER TO {}").format(table, owner_id))
        cursor.execute(sql.SQL("REVOKE ALL ON {} FROM PUBLIC, {}").format(table, app))
        cursor.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, app))
    # What the owner's functions read: a row's tenant through its parent,
    # and a table's rows counted before a TRUNCATE.
    for tracked in TRACKED:
        cursor.execute("SELECT to_regclass(%s)", [tracked.table])
        if cursor.fetchone()[0] is not None:
            table = sql.Identifier(tracked.table)
            cursor.execute(sql.SQL("GRANT SELECT ON {} TO {}").format(table, owner_id))
    retire = sql.SQL(RETIRE)
    cursor.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(retire))
    cursor.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(retire, app))
    cursor.execute(SCHEMA_EVENTS)
    for function in SCHEMA_FUNCTIONS:
        cursor.execute(
            sql.SQL("ALTER FUNCTION {} SET search_path = {}, pg_catalog, pg_temp").format(
                sql.SQL(function), schema
            )
        )
    for function in (*FUNCTIONS, *CHAIN_FUNCTIONS, *SCHEMA_FUNCTIONS):
        cursor.execute(sql.SQL("ALTER FUNCTION {} OWNER TO {}").format(sql.SQL(function), owner_id))
    # Last: from here on every schema change is an entry, written as the owner.
    cursor.execute(SCHEMA_TRIGGERS)
