"""The audit trail through the API: finance staff read every entry (or one
tenant's, `tenant=`); a tenant's owners, signed in or with a key holding
`audit:read`, read their own tenant's. Newest first, a page at a time
(`before=` the last id seen), or the whole selection as CSV."""

from __future__ import annotations

from dataclasses import replace

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.forms import AuditFilterForm, audit_query_parse
from audit.selectors import CSV_COLUMNS, audit_csv_rows, audit_entry_list, entry_record
from audit.tracked import TRACKED
from core.api_errors import validated
from core.api_query import EMPTY
from core.csv_stream import csv_response
from tenants.api.permissions import request_principal, scope_required, tenant_scope

TAGS = ["audit"]


def _filter_values(name: str, field) -> list[str] | None:
    """The values a filter takes, as the schema enumerates them (the form
    refuses any other with a 400): the audited tables, the actions, the
    ways in; None for a free one."""
    if name == "table":
        return sorted(t.table for t in TRACKED)
    choices = getattr(field, "choices", None)
    return [value for value, _label in choices if value] if choices else None


FILTERS = [
    OpenApiParameter(
        name,
        OpenApiTypes.DATE if name in {"since", "until"} else OpenApiTypes.STR,
        description=" ".join(filter(None, [str(field.help_text or ""), "Sent empty: a 400."])),
        enum=_filter_values(name, field),
    )
    for name, field in AuditFilterForm.base_fields.items()
]


class PageIn(serializers.Serializer):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=1000, default=100)
    before = serializers.IntegerField(required=False, min_value=1)


class AuditEntryOut(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.DateTimeField()
    actor = serializers.CharField()
    via = serializers.CharField()
    tenant = serializers.CharField(allow_null=True)
    subject = serializers.CharField()
    table = serializers.CharField()
    row_id = serializers.CharField()
    action = serializers.CharField()
    changed = serializers.ListField(child=serializers.CharField())
    before = serializers.JSONField(allow_null=True)
    after = serializers.JSONField(allow_null=True)
    request = serializers.CharField()
    transaction_id = serializers.IntegerField()


class AuditPageOut(serializers.Serializer):
    results = AuditEntryOut(many=True)
    next_before = serializers.IntegerField(allow_null=True)


def _entries(request):
    # The page's form sends every filter, "" meaning any; through the API a
    # filter sent empty is a 400 naming it, as for every query parameter
    # (core.api_query), rather than read as not given.
    params = request.query_params
    empty = {
        name: [EMPTY]
        for name in AuditFilterForm.base_fields
        if name in params and "" in params.getlist(name)
    }
    if empty:
        raise serializers.ValidationError(empty)
    query = audit_query_parse(params)
    tenant = tenant_scope(request, query.tenant_slug or None)
    return audit_entry_list(
        tenant=tenant,
        query=replace(query, tenant_slug=""),
        reader_is_tenant=not request_principal(request).for_platform,
    )


class AuditEntryListView(APIView):
    permission_classes = [scope_required("audit:read")]

    @extend_schema(
        summary="Audit trail entries, newest first",
        parameters=[*FILTERS, PageIn],
        responses={200: AuditPageOut},
        tags=TAGS,
    )
    def get(self, request):
        page = validated(PageIn, request.query_params)
        entries = _entries(request)
        if page.get("before"):
            entries = entries.filter(id__lt=page["before"])
        rows = [entry_record(e) for e in entries[: page["limit"] + 1]]
        more = len(rows) > page["limit"]
        rows = rows[: page["limit"]]
        body = {"results": rows, "next_before": rows[-1]["id"] if more else None}
        return Response(AuditPageOut(body).data)


class AuditExportView(APIView):
    permission_classes = [scope_required("audit:read")]

    @extend_schema(
        summary="Audit trail entries as CSV",
        parameters=FILTERS,
        responses={(200, "text/csv"): OpenApiTypes.STR},
        tags=TAGS,
    )
    def get(self, request):
        return csv_response(
            audit_csv_rows(_entries(request)), columns=CSV_COLUMNS, filename="audit.csv"
        )
