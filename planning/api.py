"""The plan for finance staff: plan runs (queue one with its choices,
watch its progress) and what they found: demand forecasts, hourly with
bands, by pool, model and metric; each replica's capacity at its SLO with
its latency-against-load curve; each pool's GPUs needed against held with
its flags and money; each tier's and model's price floor."""

from __future__ import annotations

from decimal import Decimal

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_decimal import PlainDecimalField
from core.api_download import document_response
from core.api_errors import validated
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
from planning.report import plan_report_csv, plan_report_html
from planning.runs import plan_run_create
from planning.selectors import (
    capacity_list,
    floor_list,
    forecast_list,
    plan_run_latest_done,
    plan_run_list,
    pool_plan_list,
)
from planning.tasks import plan_run_enqueue
from serving.models import Pool, ServedModel
from serving.selectors import pool_gpus_held
from tenants.api.permissions import IsFinanceStaff
from tenants.choices import Tier
from tenants.models import Tenant

TAGS = ["plan"]


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


class PlanRunListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Plan runs, newest first", responses={200: PlanRunOut(many=True)}, tags=TAGS
    )
    def get(self, request):
        return Response(PlanRunOut(plan_run_list()[:50], many=True).data)

    @extend_schema(
        summary="Queue a plan run (demand forecasts for every pool and model)",
        request=PlanRunIn,
        responses={202: PlanRunOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(PlanRunIn, request.data)
        run = plan_run_create(
            as_of=params.get("as_of"),
            user=request.user,
            band=params["band"],
            headroom_percent=params["headroom_percent"],
            target_margin_percent=params["target_margin_percent"],
        )
        plan_run_enqueue(run.pk)
        return Response(PlanRunOut(run).data, status=status.HTTP_202_ACCEPTED)


class PlanRunDetailView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(summary="A plan run and its progress", responses={200: PlanRunOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(PlanRunOut(plan_run_list().get(pk=pk)).data)


class PlanReportView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="A done plan run as a report: CSV (every section) or HTML",
        operation_id="plan_report_download",
        responses={(200, "text/csv"): OpenApiTypes.BINARY},
        tags=TAGS,
    )
    def get(self, request, pk: int, fmt: str):
        run = plan_run_list().filter(pk=pk, status="done").first()
        if run is None:
            raise exceptions.NotFound(f"no done plan run {pk}")
        body = plan_report_csv(run) if fmt == "csv" else plan_report_html(run)
        return document_response(body, fmt=fmt, name=f"plan-{run.as_of:%Y%m%d%H}")


class WhatIfView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Queue a what-if on a plan: move a tenant, add or remove GPUs, change a price",
        request=WhatIfIn,
        responses={202: PlanRunOut},
        tags=TAGS,
    )
    def post(self, request):
        params = validated(WhatIfIn, request.data)
        run = what_if_create(params, user=request.user)
        plan_run_enqueue(run.pk)
        return Response(PlanRunOut(run).data, status=status.HTTP_202_ACCEPTED)


def what_if_create(params: dict, *, user) -> PlanRun:
    """A what-if run on `params["baseline"]` (default: the latest done
    plan that is not one), with its as-of and choices (404 with none)."""
    if "baseline" in params:
        baseline = PlanRun.objects.get(pk=params["baseline"])
    else:
        baseline = plan_run_latest_done(what_ifs=False)
        if baseline is None:
            raise exceptions.NotFound("no plan run has finished yet: queue one")
    changes = {
        "move_tenant": params.get("move_tenant"),
        "gpus": [dict(g) for g in params.get("gpus", [])],
        "prices": [{**p, "percent": f"{p['percent']}"} for p in params.get("prices", [])],
    }
    return plan_run_create(
        as_of=baseline.as_of,
        user=user,
        band=baseline.band,
        headroom_percent=baseline.headroom_percent,
        target_margin_percent=baseline.target_margin_percent,
        what_if={k: v for k, v in changes.items() if v},
        baseline=baseline,
    )


def _run_chosen(params) -> PlanRun:
    """The done run asked for, or the latest done one (404 naming it)."""
    if "run" in params:
        run = plan_run_list().filter(pk=params["run"], status="done").first()
        if run is None:
            raise exceptions.NotFound(f"no done plan run {params['run']}")
        return run
    run = plan_run_latest_done(what_ifs=False)
    if run is None:
        raise exceptions.NotFound("no plan run has finished yet: queue one")
    return run


class ForecastListView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(
        summary="Demand forecasts of a plan run: hourly, with 80% and 95% bands",
        parameters=[ForecastQueryIn],
        responses={200: ForecastOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        params = validated(ForecastQueryIn, request.query_params)
        run = _run_chosen(params)
        forecasts = forecast_list(
            run=run,
            pool_name=params.get("pool"),
            model_name=params.get("model"),
            metric=params.get("metric"),
        )
        return Response(ForecastOut(forecasts, many=True).data)


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


def _run_view(out, lister, summary: str):
    class View(APIView):
        permission_classes = [IsFinanceStaff]

        @extend_schema(
            summary=summary, parameters=[RunQueryIn], responses={200: out(many=True)}, tags=TAGS
        )
        def get(self, request):
            run = _run_chosen(validated(RunQueryIn, request.query_params))
            return Response(out(lister(run=run), many=True).data)

    View.__name__ = f"{out.__name__[:-3]}ListView"
    return View


CapacityListView = _run_view(
    CapacityOut,
    capacity_list,
    "Each replica's capacity at its pool's SLO, with its latency-against-load curve",
)
PoolPlanListView = _run_view(
    PoolPlanOut, pool_plan_list, "Each pool's GPUs needed against held, its flags and their money"
)
PriceFloorListView = _run_view(
    PriceFloorOut, floor_list, "Each tier's and model's price floor at the run's target margin"
)
