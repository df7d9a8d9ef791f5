"""Shapes of the cost API (finance staff only). Inputs are checked here for
type and range; the services check what needs the database (overlaps),
and either way a bad input is a 400 naming its field."""

from __future__ import annotations

from datetime import timedelta

from rest_framework import serializers

from billing.choices import CostComponent, RateBasis
from billing.costs.scenarios import COMPARE_BY
from billing.costs.selectors import GROUP_KEYS
from billing.models import AllocationRun, CostPeriodReopening, CostRate, CostScenario
from core.api_decimal import PlainDecimalField
from core.api_query import END_AFTER_START, QueryIn, range_help, range_validated
from core.api_time import SupportedDateTimeField
from serving.choices import IdleCostPolicy
from serving.models import Pool

DATE_OR_TIME = ["iso-8601", "%Y-%m-%d"]
MAX_QUERY = timedelta(days=400)


class PeriodIn(QueryIn):
    start = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text="Inclusive.")
    end = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text=range_help("400 days"))
    scenario = serializers.PrimaryKeyRelatedField(
        queryset=CostScenario.objects.all(),
        required=False,
        help_text="A scenario's id; default: the booked results.",
    )

    def validate(self, attrs):
        return range_validated(attrs, longest=MAX_QUERY)


class AllocationQueryIn(PeriodIn):
    group_by = serializers.CharField(
        default="tier", help_text=f"Comma-separated, of: {', '.join(GROUP_KEYS)}."
    )

    def validate_group_by(self, value: str) -> list[str]:
        keys = [k.strip() for k in value.split(",") if k.strip()]
        unknown = [k for k in keys if k not in GROUP_KEYS]
        if not keys or unknown:
            raise serializers.ValidationError(f"choose from {', '.join(GROUP_KEYS)}")
        return keys


class UtilizationQueryIn(PeriodIn):
    pool = serializers.PrimaryKeyRelatedField(queryset=Pool.objects.all(), required=False)


class CostRateQueryIn(QueryIn):
    component = serializers.ChoiceField(choices=CostComponent.choices, required=False)


class CostRateIn(serializers.Serializer):
    component = serializers.ChoiceField(choices=CostComponent.choices)
    basis = serializers.ChoiceField(choices=RateBasis.choices)
    amount = PlainDecimalField(max_digits=24, decimal_places=9, min_value=0)
    currency = serializers.CharField(max_length=3, default="USD")
    pool = serializers.PrimaryKeyRelatedField(
        queryset=Pool.objects.all(),
        required=False,
        allow_null=True,
        help_text="A pool's id; none: every pool.",
    )
    hour_from = serializers.IntegerField(min_value=0, max_value=23, default=0)
    hour_to = serializers.IntegerField(min_value=1, max_value=24, default=24)
    effective_from = SupportedDateTimeField(input_formats=DATE_OR_TIME)
    effective_to = SupportedDateTimeField(
        input_formats=DATE_OR_TIME, required=False, allow_null=True
    )
    note = serializers.CharField(max_length=300, required=False, default="", allow_blank=True)


class CostRateUpdateIn(serializers.Serializer):
    basis = serializers.ChoiceField(choices=RateBasis.choices, required=False)
    amount = PlainDecimalField(max_digits=24, decimal_places=9, min_value=0, required=False)
    hour_from = serializers.IntegerField(min_value=0, max_value=23, required=False)
    hour_to = serializers.IntegerField(min_value=1, max_value=24, required=False)
    effective_from = SupportedDateTimeField(input_formats=DATE_OR_TIME, required=False)
    effective_to = SupportedDateTimeField(
        input_formats=DATE_OR_TIME, required=False, allow_null=True
    )
    note = serializers.CharField(max_length=300, required=False, allow_blank=True)


class CostRateOut(serializers.ModelSerializer):
    class Meta:
        model = CostRate
        fields = ["id", *CostRate.INPUT_FIELDS, "created_at"]


class CostReopeningIn(serializers.Serializer):
    start = SupportedDateTimeField(input_formats=DATE_OR_TIME)
    end = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text=END_AFTER_START)
    reason = serializers.CharField(max_length=500, help_text="Why; kept with who and when.")


class CostReopeningOut(serializers.ModelSerializer):
    reopened_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = CostPeriodReopening
        fields = ["id", "start", "end", "reason", "reopened_by", "reopened_at"]


class AllocationRunIn(serializers.Serializer):
    start = SupportedDateTimeField(input_formats=DATE_OR_TIME)
    end = SupportedDateTimeField(
        input_formats=DATE_OR_TIME, help_text="A whole UTC hour; " + END_AFTER_START
    )
    scenario = serializers.PrimaryKeyRelatedField(
        queryset=CostScenario.objects.all(), required=False, allow_null=True
    )


class AllocationRunOut(serializers.ModelSerializer):
    progress = serializers.FloatField(help_text="Hours written / hours to write.")  # ok-float

    class Meta:
        model = AllocationRun
        fields = [
            "id",
            "scenario",
            "start",
            "end",
            "status",
            "hours_done",
            "hours_total",
            "progress",
            "warnings",
            "error",
            "created_at",
            "started_at",
            "finished_at",
        ]


class ScenarioIn(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    description = serializers.CharField(max_length=500, required=False, default="")
    start = SupportedDateTimeField(input_formats=DATE_OR_TIME)
    end = SupportedDateTimeField(input_formats=DATE_OR_TIME, help_text=END_AFTER_START)
    idle_cost_policy = serializers.ChoiceField(
        choices=IdleCostPolicy.choices,
        required=False,
        default="",
        help_text="Override every shared pool's idle policy; default: each pool's own.",
    )
    rates = CostRateIn(many=True, required=False, default=list)

    def validate(self, attrs):
        if attrs["end"] <= attrs["start"]:
            raise serializers.ValidationError({"end": ["must be after start"]})
        return attrs


class ScenarioOut(serializers.ModelSerializer):
    rates = CostRateOut(many=True, read_only=True)

    class Meta:
        model = CostScenario
        fields = [
            "id",
            "name",
            "description",
            "start",
            "end",
            "idle_cost_policy",
            "rates",
            "created_at",
        ]


class CompareQueryIn(QueryIn):
    by = serializers.ChoiceField(choices=list(COMPARE_BY), default="tenant")


class CostRowOut(serializers.Serializer):
    tier = serializers.CharField(required=False)
    pool = serializers.CharField(required=False)
    tenant = serializers.CharField(required=False)
    model = serializers.CharField(required=False, allow_null=True)
    hour = serializers.DateTimeField(required=False)
    day = serializers.DateTimeField(required=False)
    month = serializers.DateTimeField(required=False)
    device_seconds = serializers.DecimalField(max_digits=24, decimal_places=6)
    capital = serializers.DecimalField(max_digits=28, decimal_places=9)
    energy = serializers.DecimalField(max_digits=28, decimal_places=9)
    other_opex = serializers.DecimalField(max_digits=28, decimal_places=9)
    idle = serializers.DecimalField(max_digits=28, decimal_places=9)
    total = serializers.DecimalField(max_digits=28, decimal_places=9)


class UnallocatedOut(serializers.Serializer):
    tier = serializers.CharField(required=False)
    pool = serializers.CharField(required=False)
    unallocated = serializers.DecimalField(max_digits=28, decimal_places=9)
    total = serializers.DecimalField(max_digits=28, decimal_places=9)


class AllocationSummaryOut(serializers.Serializer):
    results = CostRowOut(many=True)
    unallocated = UnallocatedOut(many=True, help_text="Only with group_by tier or pool.")


class CostPerTokenOut(serializers.Serializer):
    model = serializers.CharField()
    pool = serializers.CharField()
    cost = serializers.DecimalField(max_digits=28, decimal_places=9)
    prompt_tokens = serializers.IntegerField()
    completion_tokens = serializers.IntegerField()
    cost_per_million_tokens = serializers.DecimalField(
        max_digits=28, decimal_places=9, allow_null=True
    )


class UtilizationOut(serializers.Serializer):
    hour = serializers.DateTimeField()
    pool = serializers.CharField(source="pool.name")
    gpus = serializers.IntegerField()
    busy_seconds = serializers.DecimalField(max_digits=20, decimal_places=6)
    capacity_seconds = serializers.DecimalField(max_digits=20, decimal_places=6)
    utilization = serializers.SerializerMethodField()
    total = serializers.DecimalField(max_digits=28, decimal_places=9)
    unallocated = serializers.DecimalField(max_digits=28, decimal_places=9)

    def get_utilization(self, row) -> float:  # ok-float: a utilization ratio, shown
        ratio = row.busy_seconds / row.capacity_seconds if row.capacity_seconds else 0
        return float(ratio)  # ok-float: a ratio, not money


class CompareRowOut(serializers.Serializer):
    key = serializers.CharField()
    booked = serializers.DecimalField(max_digits=28, decimal_places=9)
    scenario = serializers.DecimalField(max_digits=28, decimal_places=9)
    difference = serializers.DecimalField(max_digits=28, decimal_places=9)
