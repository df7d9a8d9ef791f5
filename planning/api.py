"""The plan for finance staff: plan runs (queue one, watch its progress)
and their demand forecasts, hourly with bands, by pool, model and metric."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_errors import validated
from core.api_time import SupportedDateTimeField
from planning.models import DemandForecast, Metric, PlanRun
from planning.runs import plan_run_create
from planning.selectors import forecast_list, plan_run_latest_done, plan_run_list
from planning.tasks import plan_run_enqueue
from tenants.api.permissions import IsFinanceStaff

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
            "error",
            "created_at",
            "finished_at",
        ]


class PlanRunIn(serializers.Serializer):
    as_of = SupportedDateTimeField(
        required=False,
        help_text="Forecast from the hour this falls in (default: now); never later than now.",
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


class ForecastQueryIn(serializers.Serializer):
    run = serializers.IntegerField(
        required=False, help_text="A done plan run (default: the latest)."
    )
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
        run = plan_run_create(as_of=params.get("as_of"), user=request.user)
        plan_run_enqueue(run.pk)
        return Response(PlanRunOut(run).data, status=status.HTTP_202_ACCEPTED)


class PlanRunDetailView(APIView):
    permission_classes = [IsFinanceStaff]

    @extend_schema(summary="A plan run and its progress", responses={200: PlanRunOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(PlanRunOut(plan_run_list().get(pk=pk)).data)


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
        if "run" in params:
            run = plan_run_list().filter(pk=params["run"], status="done").first()
            if run is None:
                raise exceptions.NotFound(f"no done plan run {params['run']}")
        else:
            run = plan_run_latest_done()
            if run is None:
                raise exceptions.NotFound("no plan run has finished yet: queue one")
        forecasts = forecast_list(
            run=run,
            pool_name=params.get("pool"),
            model_name=params.get("model"),
            metric=params.get("metric"),
        )
        return Response(ForecastOut(forecasts, many=True).data)
