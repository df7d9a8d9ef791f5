"""The SLO API. GET /slo: compliance over [start, end), as a whole and
per UTC day, against the tenant's policy: a tenant's own (an API key
with `usage:read`, or a member's session; another tenant's slug is not
found), or for finance staff every tenant's or one (`tenant=`). Finance
staff also waive or adjust a draft invoice's SLA credits
(POST /invoices/{id}/sla-credits) and read the decisions made."""

from __future__ import annotations

from datetime import timedelta

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.invoice_serializers import InvoiceDetailOut
from billing.choices import SlaAdjustmentAction, SloMetric
from billing.invoicing.selectors import invoice_get
from billing.invoicing.sla_adjustments import sla_credit_adjust
from billing.invoicing.sla_credits import sla_decisions
from billing.models import SlaCreditAdjustment
from billing.sla.selectors import MAX_DAYS, slo_compliance
from core.api_decimal import PlainDecimalField
from core.api_errors import validated
from core.api_query import QueryIn, range_help, range_validated
from core.api_time import SupportedDateTimeField
from tenants.api.permissions import IsFinanceStaff, scope_required, tenant_scope

TAGS = ["slo"]


class SloQueryIn(QueryIn):
    start = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"], help_text="Inclusive; a date or ISO timestamp."
    )
    end = SupportedDateTimeField(
        input_formats=["iso-8601", "%Y-%m-%d"], help_text=range_help(f"{MAX_DAYS} days")
    )
    tenant = serializers.SlugField(
        required=False, help_text="Finance staff: one tenant. Tenants: only their own slug."
    )

    def validate(self, attrs):
        return range_validated(attrs, longest=timedelta(days=MAX_DAYS))


class SloMetricOut(serializers.Serializer):
    metric = serializers.ChoiceField(choices=SloMetric.choices)
    measured = serializers.DecimalField(max_digits=14, decimal_places=4, allow_null=True)
    target = serializers.DecimalField(max_digits=14, decimal_places=4, allow_null=True)
    met = serializers.BooleanField(
        allow_null=True, help_text="null: no target, or no request to measure."
    )


class SloComplianceOut(serializers.Serializer):
    day = serializers.DateField(allow_null=True, help_text="null: the whole range.")
    requests = serializers.IntegerField(
        help_text="Counted for availability: all but those refused for the tenant's own cause."
    )
    failed = serializers.IntegerField(help_text="Failed for a platform cause.")
    timed = serializers.IntegerField(help_text="Completed, with a time to first token.")
    availability_percent = serializers.DecimalField(
        source="availability", max_digits=9, decimal_places=4, allow_null=True
    )
    ttft_p95_ms = serializers.DecimalField(max_digits=14, decimal_places=3, allow_null=True)
    itl_p95_ms = serializers.DecimalField(max_digits=14, decimal_places=3, allow_null=True)
    breached = serializers.BooleanField()
    metrics = SloMetricOut(many=True)


class SloPolicyOut(serializers.Serializer):
    name = serializers.CharField()
    availability_percent = serializers.DecimalField(max_digits=7, decimal_places=4, allow_null=True)
    ttft_p95_ms = serializers.DecimalField(max_digits=12, decimal_places=3, allow_null=True)
    itl_p95_ms = serializers.DecimalField(max_digits=12, decimal_places=3, allow_null=True)
    credit_cap_percent = serializers.DecimalField(max_digits=5, decimal_places=2)


class TenantSloOut(serializers.Serializer):
    tenant = serializers.CharField(source="tenant.slug")
    tier = serializers.CharField(source="tenant.tier")
    policy = SloPolicyOut(allow_null=True)
    period = SloComplianceOut(allow_null=True, help_text="null: no requests in the range.")
    days = SloComplianceOut(many=True)


class SloOut(serializers.Serializer):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()
    tenants = TenantSloOut(many=True)


class SloView(APIView):
    permission_classes = [scope_required("usage:read")]

    @extend_schema(
        summary="SLO compliance, as a whole and per UTC day",
        description="Availability counts every request but those refused for the tenant's "
        "own cause (its rate limits and budgets, bad requests) and fails those that failed "
        "for a platform cause (5xx, 503 no replica, 429 from the platform's queue). TTFT: "
        "from the gateway receiving a completed request to its first token. Inter-token "
        "latency: (end - first token) / (completion tokens - 1), requests of 2 tokens or more. "
        f"Percentiles are interpolated (percentile_cont). At most {MAX_DAYS} days.",
        parameters=[SloQueryIn],
        responses={200: SloOut},
        tags=TAGS,
    )
    def get(self, request):
        query = SloQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        tenant = tenant_scope(request, params.get("tenant"))
        rows = slo_compliance(tenant=tenant, start=params["start"], end=params["end"])
        out = {"start": params["start"], "end": params["end"], "tenants": rows}
        return Response(SloOut(out).data)


class SlaCreditAdjustIn(serializers.Serializer):
    metric = serializers.ChoiceField(choices=SloMetric.choices)
    action = serializers.ChoiceField(
        choices=SlaAdjustmentAction.choices,
        help_text="waive: no credit; adjust: credit_percent of the usage charges instead.",
    )
    credit_percent = PlainDecimalField(
        max_digits=5,
        decimal_places=2,
        min_value=0,
        max_value=100,
        required=False,
        allow_null=True,
        help_text="With adjust only.",
    )
    reason = serializers.CharField(max_length=300, help_text="Recorded with who and when.")


class SlaCreditAdjustmentOut(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    created_by = serializers.CharField(source="created_by.get_username", allow_null=True)

    class Meta:
        model = SlaCreditAdjustment
        fields = [
            "id",
            "tenant",
            "period_start",
            "metric",
            "action",
            "credit_percent",
            "reason",
            "created_by",
            "created_at",
        ]


class SlaCreditAdjustedOut(serializers.Serializer):
    adjustment = SlaCreditAdjustmentOut()
    invoice = InvoiceDetailOut()


class InvoiceSlaCreditView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Finance's decisions on the SLA credits of an invoice's period, newest first",
        responses={200: SlaCreditAdjustmentOut(many=True)},
        tags=TAGS,
    )
    def get(self, request, pk: int):
        invoice = invoice_get(tenant=None, pk=pk)
        rows = sla_decisions(tenant_id=invoice.tenant_id, period_start=invoice.period_start)
        return Response(SlaCreditAdjustmentOut(rows, many=True).data)

    @extend_schema(
        summary="Waive or adjust a draft invoice's SLA credit (the draft is rebuilt)",
        description="Only a draft: a finalized invoice never changes (409; issue a credit "
        "note instead). The decision is recorded with who made it, when and why.",
        request=SlaCreditAdjustIn,
        responses={201: SlaCreditAdjustedOut},
        tags=TAGS,
    )
    def post(self, request, pk: int):
        data = validated(SlaCreditAdjustIn, request.data)
        invoice = invoice_get(tenant=None, pk=pk)
        adjustment = sla_credit_adjust(invoice_id=invoice.pk, by=request.user, **data)
        out = {"adjustment": adjustment, "invoice": invoice_get(tenant=None, pk=pk)}
        return Response(SlaCreditAdjustedOut(out).data, status=status.HTTP_201_CREATED)
