"""Margin reports for finance staff: list, ask for one (queued), read its
totals and status, download it as CSV or HTML."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.choices import ReportKind, RunStatus
from billing.models import MarginReport
from billing.reports.margin_reports import margin_report_request
from billing.tasks import margin_report_enqueue
from core.api_download import document_response
from core.api_errors import Conflict, validated
from core.api_query import END_AFTER_START
from core.api_time import SupportedDateTimeField
from tenants.api.permissions import IsFinanceStaff

TAGS = ["margins"]


class MarginReportOut(serializers.ModelSerializer):
    csv_url = serializers.SerializerMethodField()
    html_url = serializers.SerializerMethodField()

    class Meta:
        model = MarginReport
        fields = [
            "id",
            "kind",
            "period_start",
            "period_end",
            "previous_start",
            "previous_end",
            "currency",
            "status",
            "totals",
            "fx_rates",
            "forecast",
            "error",
            "created_at",
            "finished_at",
            "csv_url",
            "html_url",
        ]

    def get_csv_url(self, report) -> str:
        return f"/api/v1/margin-reports/{report.pk}/csv"

    def get_html_url(self, report) -> str:
        return f"/api/v1/margin-reports/{report.pk}/html"


class MarginReportIn(serializers.Serializer):
    start = SupportedDateTimeField()
    end = SupportedDateTimeField(help_text=END_AFTER_START)

    def validate(self, data):
        if data["end"] <= data["start"]:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return data


class MarginReportListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Margin reports, newest period first",
        responses={200: MarginReportOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        reports = MarginReport.objects.defer("csv", "html")[:100]
        return Response(MarginReportOut(reports, many=True).data)

    @extend_schema(
        summary="Ask for a margin report of any period (queued)",
        request=MarginReportIn,
        responses={202: MarginReportOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(MarginReportIn, request.data)
        report = margin_report_request(kind=ReportKind.ADHOC, requested_by=request.user, **params)
        margin_report_enqueue(report.pk)
        return Response(MarginReportOut(report).data, status=status.HTTP_202_ACCEPTED)


class MarginReportDetailView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(responses={200: MarginReportOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(MarginReportOut(MarginReport.objects.defer("csv", "html").get(pk=pk)).data)


class MarginReportDownloadView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Download a finished report as CSV (every level) or HTML",
        operation_id="margin_report_download",
        responses={(200, "text/csv"): OpenApiTypes.BINARY},
        tags=TAGS,
    )
    def get(self, request, pk: int, fmt: str):
        report = MarginReport.objects.get(pk=pk)
        if report.status != RunStatus.DONE:
            reason = f": {report.error}" if report.error else ""
            raise Conflict(f"the report is {report.status}{reason}", code="report_not_ready")
        name = f"margin-{report.kind}-{report.period_start:%Y%m%d}-{report.period_end:%Y%m%d}"
        return document_response(getattr(report, fmt), fmt=fmt, name=name)
