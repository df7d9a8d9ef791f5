"""GET /api/v1/usage/focus: the FOCUS 1.2 export, CSV or Parquet.

`dataset=billing` (the default): what tenants are billed, a tenant its
own, finance staff every tenant's or one's (billing.reports.focus).
`dataset=fleet` (finance staff only): what each GPU costs per day
(billing.reports.focus_fleet)."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers

from billing.reports.focus import focus_billing_rows
from billing.reports.focus_columns import DECIMAL_COLUMNS, DECIMAL_PLACES, FOCUS_COLUMNS
from billing.reports.focus_fleet import focus_fleet_rows
from core.api_download import DownloadView, parquet_response
from core.api_query import QueryIn, range_help, range_validated
from core.api_time import SupportedDateTimeField
from core.csv_stream import csv_response
from tenants.api.permissions import request_principal, scope_required, tenant_scope

LONGEST = timedelta(days=1100)


class FocusQueryIn(QueryIn):
    start = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"],
        help_text="Inclusive; a date or ISO timestamp. Billing periods that overlap "
        "[start, end) are exported whole.",
    )
    end = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"], help_text=range_help("1,100 days")
    )
    dataset = serializers.ChoiceField(
        choices=["billing", "fleet"],
        default="billing",
        help_text="billing: what tenants are billed; fleet (finance staff): what each GPU "
        "costs per day.",
    )
    tenant = serializers.SlugField(
        required=False, help_text="Finance staff: one tenant. Tenants: only their own slug."
    )
    format = serializers.ChoiceField(choices=["csv", "parquet"], default="csv")

    def validate(self, attrs):
        return range_validated(attrs, longest=LONGEST)


class FocusExportView(DownloadView):
    permission_classes = [scope_required("usage:read")]
    formats_help = "csv or parquet"

    @extend_schema(
        summary="FOCUS 1.2 cost-and-usage export (CSV or Parquet)",
        description=(
            "One row per invoice line and credit note of every billing period overlapping "
            "the range: BilledCost summed per InvoiceId is the invoice's total. A period "
            "not invoiced yet is rated as it stands, with `x_BillingStatus` = `unbilled` "
            "and a provisional InvoiceId (`provisional-<tenant>-<period start>`). "
            "`dataset=fleet` (finance staff) is each GPU's own cost per day, as the "
            "allocation's cost model computes it for the fleet as it stands (the pool in Tags)."
        ),
        parameters=[FocusQueryIn],
        responses={
            (200, "text/csv"): OpenApiTypes.BINARY,
            (200, "application/vnd.apache.parquet"): OpenApiTypes.BINARY,
        },
        tags=["usage"],
    )
    def get(self, request):
        query_in = FocusQueryIn(data=request.query_params)
        query_in.is_valid(raise_exception=True)
        params = query_in.validated_data
        start, end = params["start"], params["end"]
        if params["dataset"] == "fleet":
            if not request_principal(request).is_finance or params.get("tenant"):
                raise exceptions.PermissionDenied(
                    "dataset=fleet is the operator's own cost: finance staff only, for no tenant"
                )
            rows = focus_fleet_rows(start=start, end=end)
        else:
            rows = focus_billing_rows(
                tenant=tenant_scope(request, params.get("tenant")), start=start, end=end
            )
        name = f"focus-{params['dataset']}-{start:%Y%m%d}-{end:%Y%m%d}"
        if params["format"] == "parquet":
            return parquet_response(
                rows,
                columns=FOCUS_COLUMNS,
                decimals=DECIMAL_COLUMNS,
                places=DECIMAL_PLACES,
                filename=f"{name}.parquet",
            )
        return csv_response(rows, columns=FOCUS_COLUMNS, filename=f"{name}.csv")
