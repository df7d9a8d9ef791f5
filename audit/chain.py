"""A hash chain over the audit trail: each entry, as it commits, gets the
next link, SHA-256 of the link before and the entry's own content. An
entry edited or deleted, a link removed, or an entry slipped in beside the
chain shows in `chain_verify` (`manage.py audit_verify`). Links are never
removed: an entry retention archived keeps its link, and the next link
still proves its successor.

Links are made at commit (a deferred trigger), under a lock held only from
there to the commit's end: transactions that write audited rows never wait
on each other until they commit, and links follow commit order."""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import connection

# The content an entry is proven by: its columns by name, the time in UTC
# (a session's time zone never changes the text).
HASH_FUNCTION = """
CREATE OR REPLACE FUNCTION audit_link_hash(prev bytea, e audit_auditentry) RETURNS bytea
LANGUAGE sql STABLE AS $$
  SELECT sha256(coalesce(prev, ''::bytea) || convert_to(jsonb_build_object(
    'id', e.id,
    'at', to_char(e.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US'),
    'table', e."table", 'row_id', e.row_id, 'action', e.action,
    'changed', to_jsonb(e.changed), 'before', e.before, 'after', e.after,
    'tenant_id', e.tenant_id, 'actor', e.actor, 'actor_user_id', e.actor_user_id,
    'via', e.via, 'request', e.request, 'transaction_id', e.transaction_id
  )::text, 'UTF8'))
$$;
"""
# The entries there are before the chain, linked in id order (a migration).
BACKFILL = """
DO $$
DECLARE
  e audit_auditentry;
  h bytea;
  n bigint := 0;
BEGIN
  FOR e IN SELECT * FROM audit_auditentry ORDER BY id LOOP
    n := n + 1;
    h := audit_link_hash(h, e);
    INSERT INTO audit_auditlink (seq, entry_id, hash) VALUES (n, e.id, h);
  END LOOP;
END $$;
"""
LINK_SQL = """
CREATE OR REPLACE FUNCTION audit_link() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER AS $$
DECLARE
  head_seq bigint;
  head_hash bytea;
BEGIN
  PERFORM pg_advisory_xact_lock(1633, 1);
  SELECT seq, hash INTO head_seq, head_hash FROM audit_auditlink ORDER BY seq DESC LIMIT 1;
  INSERT INTO audit_auditlink (seq, entry_id, hash)
  VALUES (coalesce(head_seq, 0) + 1, NEW.id, audit_link_hash(head_hash, NEW));
  RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS audit_link ON audit_auditentry;
CREATE CONSTRAINT TRIGGER audit_link AFTER INSERT ON audit_auditentry
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_link();
DROP TRIGGER IF EXISTS audit_append_only ON audit_auditlink;
CREATE TRIGGER audit_append_only BEFORE UPDATE OR DELETE ON audit_auditlink
  FOR EACH ROW EXECUTE FUNCTION audit_refuse();
DROP TRIGGER IF EXISTS audit_no_truncate ON audit_auditlink;
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit_auditlink
  FOR EACH STATEMENT EXECUTE FUNCTION audit_refuse();
DROP TRIGGER IF EXISTS audit_insert_guard ON audit_auditlink;
CREATE TRIGGER audit_insert_guard BEFORE INSERT ON audit_auditlink
  FOR EACH ROW EXECUTE FUNCTION audit_insert_guard();
"""
FUNCTIONS = ("audit_link_hash(bytea, audit_auditentry)", "audit_link()")
SHOWN = 20  # of each kind of problem, the first few named

# Every link checked against the one before it and its entry, in one pass.
_BROKEN = """
SELECT l.seq, l.entry_id,
       CASE WHEN p.seq IS NULL AND l.seq > 1 THEN 'gap'
            WHEN e.id IS NULL THEN 'gone'
            ELSE 'changed' END
  FROM audit_auditlink l
  LEFT JOIN audit_auditlink p ON p.seq = l.seq - 1
  LEFT JOIN audit_auditentry e ON e.id = l.entry_id
 WHERE (p.seq IS NULL AND l.seq > 1)
    OR (e.id IS NULL AND NOT EXISTS (
          SELECT 1 FROM audit_auditarchive a WHERE l.entry_id BETWEEN a.first_id AND a.last_id))
    OR (e.id IS NOT NULL AND l.hash <> audit_link_hash(p.hash, e))
 ORDER BY l.seq LIMIT %s
"""
_UNLINKED = """
SELECT e.id FROM audit_auditentry e
 WHERE NOT EXISTS (SELECT 1 FROM audit_auditlink l WHERE l.entry_id = e.id)
 ORDER BY e.id LIMIT %s
"""


@dataclass
class ChainReport:
    links: int = 0
    head_seq: int = 0
    head_hash: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def intact(self) -> bool:
        return not self.problems


_WHAT = {
    "gap": "link {seq} (entry {entry}) follows a removed link",
    "gone": "entry {entry} (link {seq}) was deleted, not archived",
    "changed": "entry {entry} (link {seq}) is not what was linked: changed since",
}


def chain_verify(cursor=None, *, expect: tuple[int, str] | None = None) -> ChainReport:
    """Every link against its entry and the link before; every entry
    against the chain. `expect`: a (seq, hash) written down from an earlier
    run, which must still be there (a chain rewritten from a point on).
    `cursor`: a DB-API cursor on the trail's database (the app's if none)."""
    if cursor is None:
        with connection.cursor() as cursor:
            return chain_verify(cursor, expect=expect)
    report = ChainReport()
    cursor.execute(
        "SELECT count(*), max(seq), "
        "(SELECT encode(hash, 'hex') FROM audit_auditlink ORDER BY seq DESC LIMIT 1) "
        "FROM audit_auditlink"
    )
    report.links, head_seq, head_hash = cursor.fetchone()
    report.head_seq, report.head_hash = head_seq or 0, head_hash or ""
    cursor.execute(_BROKEN, [SHOWN])
    for seq, entry, kind in cursor.fetchall():
        report.problems.append(_WHAT[kind].format(seq=seq, entry=entry))
    cursor.execute(_UNLINKED, [SHOWN])
    for (entry,) in cursor.fetchall():
        report.problems.append(f"entry {entry} is outside the chain (written around it)")
    if expect is not None:
        seq, digest = expect
        cursor.execute("SELECT encode(hash, 'hex') FROM audit_auditlink WHERE seq = %s", [seq])
        row = cursor.fetchone()
        if row is None or row[0] != digest.lower():
            report.problems.append(
                f"link {seq} is not the {digest} written down: the chain was rewritten"
            )
    return report
