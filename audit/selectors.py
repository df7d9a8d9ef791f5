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
from django.db.models import BooleanField, OuterRef, Q, QuerySet, Subquery, Value

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


def audit_entry_list(
    *, tenant: Tenant | None, query: AuditQuery, reader_is_tenant: bool | None = None
) -> QuerySet[AuditEntry]:
    """Newest first. `tenant`: that tenant's entries; None: every entry
    (finance staff only), or `query.tenant_slug`'s. `reader_is_tenant`
    (default: whether `tenant` is given): the tenant's own people read them,
    without what is finance's (FINANCE_ONLY_*); finance staff reading one
    tenant's pass False."""
    if reader_is_tenant is None:
        reader_is_tenant = tenant is not None
    entries = AuditEntry.objects.annotate(
        tenant_slug=Subquery(Tenant.objects.filter(pk=OuterRef("tenant_id")).values("slug")[:1])
    )
    if reader_is_tenant:
        entries = _as_tenant_sees(entries)
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


# What a tenant's readers never see of their own rows in the trail: finance's
# decisions on SLA credits (with its reasons), an invoice while it is a draft
# (invoice reads hide drafts from tenants: billing.invoicing.selectors), and
# finance's internal columns of an invoice (rating warnings, usage fingerprints).
FINANCE_ONLY_TABLES = ("billing_slacreditadjustment",)
FINANCE_ONLY_COLUMNS = {"billing_invoice": ("warnings", "usage_fingerprint")}


def _as_tenant_sees(entries: QuerySet[AuditEntry]) -> QuerySet[AuditEntry]:
    drafts = Q(table="billing_invoice") & (Q(after__status="draft") | Q(after__isnull=True))
    return (
        entries.exclude(table__in=FINANCE_ONLY_TABLES)
        .exclude(drafts)
        .annotate(seen_by_tenant=Value(True, output_field=BooleanField()))
    )


def _tenant_view(entry: AuditEntry, values: dict | None) -> dict | None:
    """A row's values as its tenant may read them: finance's columns out,
    and nothing of the draft an invoice was before it was finalized."""
    if values is None or not getattr(entry, "seen_by_tenant", False):
        return values
    if entry.table == "billing_invoice" and values.get("status") == "draft":
        return None
    hidden = FINANCE_ONLY_COLUMNS.get(entry.table, ())
    return {k: v for k, v in values.items() if k not in hidden}


def entry_changes(entry: AuditEntry) -> list[tuple[str, object, object]]:
    """(column, before, after) for what the entry changed: every column of
    a created or deleted row, the changed ones of an update."""
    before = _tenant_view(entry, entry.before) or {}
    after = _tenant_view(entry, entry.after) or {}
    if entry.action == Action.UPDATE:
        columns = _columns_seen(entry)
    else:
        columns = [c for c in (after or before) if c != "id"]
    return [(c, before.get(c), after.get(c)) for c in columns]


def _columns_seen(entry: AuditEntry) -> list[str]:
    """The changed columns its reader may see."""
    hidden = FINANCE_ONLY_COLUMNS.get(entry.table, ())
    tenant = getattr(entry, "seen_by_tenant", False)
    return [c for c in entry.changed or [] if not tenant or c not in hidden]


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
        "changed": _columns_seen(entry),
        "before": _tenant_view(entry, entry.before),
        "after": _tenant_view(entry, entry.after),
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
            "before": json.dumps(record["before"], sort_keys=True) if record["before"] else "",
            "after": json.dumps(record["after"], sort_keys=True) if record["after"] else "",
        }
