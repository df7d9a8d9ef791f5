"""FX rates for finance staff: list them, enter one, or enter many at once
(all or nothing). Margin reports convert revenue with them (billing.fx)."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.errors import BillingInputError
from billing.fx_rates import (
    FxRow,
    FxRowError,
    fx_code_parse,
    fx_rate_parse,
    fx_rates_save,
)
from billing.models import FxRate
from billing.models.fx import FX_RATE
from core.api_decimal import PlainDecimalField
from core.api_errors import validated
from core.api_query import QueryIn
from core.api_time import SupportedDateField
from tenants.api.permissions import IsFinanceStaff

TAGS = ["fx"]
MAX_BULK = 10_000
LISTED = 1000


class FxRateOut(serializers.ModelSerializer):
    class Meta:
        model = FxRate
        fields = ["id", "base", "quote", "date", "rate", "source", "created_at"]


class FxRateIn(serializers.Serializer):
    base = serializers.CharField(help_text="ISO 4217 code: 1 base = rate quote.")
    quote = serializers.CharField(help_text="ISO 4217 code.")
    date = SupportedDateField(help_text="The day the rate is for (UTC).")
    rate = PlainDecimalField(**FX_RATE, help_text="Units of quote per one base.")
    source = serializers.CharField(max_length=100, required=False, default="", allow_blank=True)

    def _check(self, call, value, field):
        try:
            return call(value, where=0, field=field)
        except FxRowError as exc:
            raise serializers.ValidationError(exc.message) from None

    def validate_base(self, value: str) -> str:
        return self._check(fx_code_parse, value, "base")

    def validate_quote(self, value: str) -> str:
        return self._check(fx_code_parse, value, "quote")

    def validate_rate(self, value):
        return self._check(fx_rate_parse, value, "rate")

    def validate(self, attrs):
        if attrs["base"] == attrs["quote"]:
            raise serializers.ValidationError({"quote": ["must differ from base"]})
        return attrs


class FxRateBulkIn(serializers.Serializer):
    rates = FxRateIn(many=True, allow_empty=False, max_length=MAX_BULK)
    replace = serializers.BooleanField(
        default=False, help_text="Change rates already stored for the same pair and day."
    )


class FxRateBulkOut(serializers.Serializer):
    created = serializers.IntegerField()
    updated = serializers.IntegerField()
    unchanged = serializers.IntegerField()


class FxRateQueryIn(QueryIn):
    base = serializers.CharField(required=False)
    quote = serializers.CharField(required=False)
    start = SupportedDateField(required=False, help_text="Inclusive.")
    end = SupportedDateField(required=False, help_text="Exclusive.")

    def validate_base(self, value: str) -> str:
        return FxRateIn().validate_base(value)

    def validate_quote(self, value: str) -> str:
        return FxRateIn().validate_quote(value)


def _rows(items: list[dict]) -> list[FxRow]:
    return [
        FxRow(
            base=item["base"],
            quote=item["quote"],
            date=item["date"],
            rate=item["rate"],
            source=item.get("source", ""),
            where=index,
        )
        for index, item in enumerate(items)
    ]


class FxRateListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="FX rates, newest day first (at most 1,000)",
        parameters=[FxRateQueryIn],
        responses={200: FxRateOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        query = FxRateQueryIn(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters = {
            key: query.validated_data[param]
            for param, key in (
                ("base", "base"),
                ("quote", "quote"),
                ("start", "date__gte"),
                ("end", "date__lt"),
            )
            if param in query.validated_data
        }
        rates = FxRate.objects.filter(**filters).order_by("-date", "base", "quote")[:LISTED]
        return Response(FxRateOut(rates, many=True).data)

    @extend_schema(
        summary="Enter one rate (a pair and day already stored: 400, use bulk to replace)",
        request=FxRateIn,
        responses={201: FxRateOut},
        tags=TAGS,
    )
    def post(self, request):
        item = validated(FxRateIn, request.data)
        existing = FxRate.objects.filter(base=item["base"], quote=item["quote"], date=item["date"])
        if existing.exists():
            raise BillingInputError(
                "date", f"a {item['base']}/{item['quote']} rate for {item['date']} is stored"
            )
        fx_rates_save(rows=_rows([item]), user=request.user)
        rate = FxRate.objects.get(base=item["base"], quote=item["quote"], date=item["date"])
        return Response(FxRateOut(rate).data, status=status.HTTP_201_CREATED)


class FxRateBulkView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Enter many rates, all or none; a bad one is a 400 naming rates.<index>.<field>",
        request=FxRateBulkIn,
        responses={200: FxRateBulkOut},
        tags=TAGS,
    )
    def post(self, request):
        data = validated(FxRateBulkIn, request.data)
        try:
            result = fx_rates_save(
                rows=_rows(data["rates"]),
                replace=data["replace"],
                user=request.user,
            )
        except FxRowError as exc:
            raise BillingInputError(f"rates.{exc.where}.{exc.field}", exc.message) from None
        return Response(FxRateBulkOut(result).data)
