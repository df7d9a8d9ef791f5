"""The plan API's serializers: what it takes (a plan run's choices, a
what-if's changes) and what it shows."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone
from rest_framework import serializers

from core.api_decimal import PlainDecimalField
from core.api_query import QueryIn
from core.api_time import SupportedDateTimeField
from planning.models import (
    BANDS,
    CapacityEstimate,
    DemandForecast,
    Metric,
    PlanRun,
    PoolPlan,
    PriceFloor,
)
from serving.models import Pool, ServedModel
from serving.selectors import pool_gpus_held
from tenants.choices import Tier
from tenants.models import Tenant


class PlanRunOut(serializers.ModelSerializer):
    class Meta:
        model = PlanRun
        fields = [
            "id",
            "status",
            "as_of",
            "horizon_hours",
            "series_done",
            "series_total",
            "band",
            "headroom_percent",
            "target_margin_percent",
            "currency",
            "warnings",
            "what_if",
            "baseline",
            "error",
            "created_at",
            "finished_at",
        ]


class MoveTenantIn(serializers.Serializer):
    tenant = serializers.SlugField(help_text="The tenant moved (its slug).")
    pool = serializers.CharField(help_text="The pool it moves to (its name).")

    def validate_tenant(self, value):
        if not Tenant.objects.filter(slug=value).exists():
            raise serializers.ValidationError(f"no tenant {value!r}")
        return value

    def validate_pool(self, value):
        if not Pool.objects.filter(name=value).exists():
            raise serializers.ValidationError(f"no pool {value!r}")
        return value


class GpusIn(serializers.Serializer):
    pool = serializers.CharField()
    delta = serializers.IntegerField(help_text="GPUs added (negative: removed).")

    def validate(self, attrs):
        held = pool_gpus_held(name=attrs["pool"])
        if held is None:
            raise serializers.ValidationError({"pool": f"no pool {attrs['pool']!r}"})
        if attrs["delta"] == 0 or held + attrs["delta"] < 0:
            raise serializers.ValidationError(
                {"delta": f"the pool holds {held:g} GPUs: a change of 1 or more, to 0 or more"}
            )
        return attrs


class PriceChangeIn(serializers.Serializer):
    tier = serializers.ChoiceField(choices=Tier.choices)
    model = serializers.CharField()
    percent = PlainDecimalField(
        max_digits=6, decimal_places=2, min_value=Decimal("-99.99"), max_value=1000
    )

    def validate_model(self, value):
        if not ServedModel.objects.filter(name=value).exists():
            raise serializers.ValidationError(f"no model {value!r}")
        return value


class WhatIfIn(serializers.Serializer):
    baseline = serializers.IntegerField(
        required=False, help_text="The done plan run changed (default: the latest)."
    )
    move_tenant = MoveTenantIn(required=False)
    gpus = GpusIn(many=True, required=False)
    prices = PriceChangeIn(many=True, required=False)

    def validate_baseline(self, value):
        if not PlanRun.objects.filter(pk=value, status="done", baseline__isnull=True).exists():
            raise serializers.ValidationError(f"no done plan run {value} (not a what-if)")
        return value

    def validate(self, attrs):
        if not any(attrs.get(k) for k in ("move_tenant", "gpus", "prices")):
            raise serializers.ValidationError(
                {"move_tenant": "name a change: move_tenant, gpus or prices"}
            )
        return attrs


class PlanRunIn(serializers.Serializer):
    as_of = SupportedDateTimeField(
        required=False,
        help_text="Forecast from the hour this falls in (default: now); never later than now.",
    )

    band = serializers.ChoiceField(
        choices=BANDS,
        default="95",
        help_text="The demand GPUs are sized for: a band's top or the point.",
    )
    headroom_percent = PlainDecimalField(
        max_digits=5,
        decimal_places=2,
        min_value=0,
        max_value=200,
        default=20,
        help_text="Added to the demand a pool is sized for.",
    )
    target_margin_percent = PlainDecimalField(
        max_digits=5,
        decimal_places=2,
        min_value=-100,
        max_value=Decimal("99.99"),
        default=40,
        help_text="The margin price floors reach.",
    )

    def validate_as_of(self, value):
        if value > timezone.now():
            raise serializers.ValidationError(
                "a plan is made from what has happened: not later than now"
            )
        return value


class ForecastOut(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool_name")
    model = serializers.CharField(source="model_name")
    error = serializers.SerializerMethodField(help_text="The chosen method's backtest MASE.")

    class Meta:
        model = DemandForecast
        fields = ["pool", "model", "metric", "method", "error", "mase", "start", "point", "bands"]

    def get_error(self, forecast) -> float | None:
        return forecast.mase.get(forecast.method)


class RunQueryIn(QueryIn):  # `run=` or `pool=` sent empty: a 400 naming it
    run = serializers.IntegerField(
        required=False, help_text="A done plan run (default: the latest)."
    )


class ForecastQueryIn(RunQueryIn):
    pool = serializers.CharField(required=False)
    model = serializers.CharField(required=False)
    metric = serializers.ChoiceField(choices=Metric.choices, required=False)


class CapacityOut(serializers.ModelSerializer):
    replica = serializers.CharField(source="replica_name")
    pool = serializers.CharField(source="pool_name")
    model = serializers.CharField(source="model_name")

    class Meta:
        model = CapacityEstimate
        fields = [
            "replica",
            "pool",
            "model",
            "gpus",
            "ttft_target_ms",
            "itl_target_ms",
            "status",
            "tokens_per_hour",
            "hours",
            "note",
            "curve",
        ]


class PoolPlanOut(serializers.ModelSerializer):
    pool = serializers.CharField(source="pool_name")
    models = serializers.JSONField(source="by_model")
    currency = serializers.CharField(source="run.currency")

    class Meta:
        model = PoolPlan
        fields = [
            "pool",
            "kind",
            "gpus_held",
            "gpus_needed",
            "gpus_contracted",
            "flags",
            "busy_percent",
            "cost",
            "idle_cost",
            "credits_at_risk",
            "currency",
            "models",
        ]


class PriceFloorOut(serializers.ModelSerializer):
    model = serializers.CharField(source="model_name")
    currency = serializers.CharField(source="run.currency")
    target_margin_percent = serializers.DecimalField(
        source="run.target_margin_percent", max_digits=5, decimal_places=2
    )

    class Meta:
        model = PriceFloor
        fields = [
            "tier",
            "model",
            "tokens",
            "today",
            "floor",
            "cost",
            "revenue",
            "margin_percent",
            "target_margin_percent",
            "currency",
            "note",
        ]
