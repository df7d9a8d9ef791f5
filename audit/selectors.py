"""Reads of the audit trail. Finance staff read every entry (tenant=None,
on their code paths only); a tenant's owners read the entries of rows that
belong to their tenant."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import cache

from django.apps import apps
from django.db.models import OuterRef, QuerySet, Subquery

from audit.choices import Action
from audit.models import AuditEntry
from audit.tracked import TRACKED
from tenants.models import Tenant

CSV_COLUMNS = (
    "id",
    "at",
    "actor",
    "via",
    "tenant",
    "subject",
    "table",
    "row_id",
    "action",
    "changed",
    "before",
    "after",
    "request",
    "transaction_id",
)


@dataclass(frozen=True)
class AuditQuery:
    since: datetime | None = None
    until: datetime | None = None
    actor: str = ""
    table: str = ""
    action: str = ""
    via: str = ""
    row_id: str = ""
    tenant_slug: str = ""  # finance only: one tenant's entries


@cache
def subjects() -> dict[str, str]:
    """Each audited table's name for people ("API key", "Cost rate")."""
    by_table = {m._meta.db_table: str(m._meta.verbose_name) for m in apps.get_models()}
    return {t.table: by_table.get(t.table, t.table).capitalize() for t in TRACKED}


def audit_entry_list(*, tenant: Tenant | None, query: AuditQuery) -> QuerySet[AuditEntry]:
    """Newest first. `tenant`: that tenant's entries; None: every entry
    (finance staff only), or `query.tenant_slug`'s."""
    entries = AuditEntry.objects.annotate(
        tenant_slug=Subquery(Tenant.objects.filter(pk=OuterRef("tenant_id")).values("slug")[:1])
    )
    if tenant is not None:
        entries = entries.filter(tenant_id=tenant.pk)
    elif query.tenant_slug:
        entries = entries.filter(tenant_slug=query.tenant_slug)
    if query.since:
        entries = entries.filter(at__gte=query.since)
    if query.until:
        entries = entries.filter(at__lt=query.until)
    if query.actor:
        entries = entries.filter(actor__icontains=query.actor)
    for field in ("table", "action", "via", "row_id"):
        if getattr(query, field):
            entries = entries.filter(**{field: getattr(query, field)})
    return entries.order_by("-id")


def entry_changes(entry: AuditEntry) -> list[tuple[str, object, object]]:
    """(column, before, after) for what the entry changed: every column of
    a created or deleted row, the changed ones of an update."""
    before, after = entry.before or {}, entry.after or {}
    if entry.action == Action.UPDATE:
        columns = entry.changed or []
    else:
        columns = [c for c in (after or before) if c != "id"]
    return [(c, before.get(c), after.get(c)) for c in columns]


def entry_record(entry: AuditEntry) -> dict:
    """An entry as the API and the CSV export give it."""
    return {
        "id": entry.id,
        "at": entry.at,
        "actor": entry.actor,
        "via": entry.via,
        "tenant": entry.tenant_slug or None,
        "subject": subjects().get(entry.table, entry.table),
        "table": entry.table,
        "row_id": entry.row_id,
        "action": entry.action,
        "changed": entry.changed or [],
        "before": entry.before,
        "after": entry.after,
        "request": entry.request,
        "transaction_id": entry.transaction_id,
    }


def audit_csv_rows(entries: QuerySet[AuditEntry]) -> Iterator[dict]:
    for entry in entries.iterator(chunk_size=2000):
        record = entry_record(entry)
        yield record | {
            "at": entry.at.isoformat(),
            "tenant": record["tenant"] or "",
            "changed": " ".join(record["changed"]),
            "before": json.dumps(entry.before, sort_keys=True) if entry.before else "",
            "after": json.dumps(entry.after, sort_keys=True) if entry.after else "",
        }
