"""The plan for finance staff: plan runs (queue one with its choices,
watch its progress) and what they found: demand forecasts, hourly with
bands, by pool, model and metric; each replica's capacity at its SLO with
its latency-against-load curve; each pool's GPUs needed against held with
its flags and money; each tier's and model's price floor."""

from __future__ import annotations

from typing import TYPE_CHECKING

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_download import document_response
from core.api_errors import validated
from planning.api.serializers import (
    CapacityOut,
    ForecastOut,
    ForecastQueryIn,
    PlanRunIn,
    PlanRunOut,
    PoolPlanOut,
    PriceFloorOut,
    RunQueryIn,
    WhatIfIn,
)
from planning.report import plan_report_csv, plan_report_html
from planning.runs import PlanRunMissing, plan_run_create, what_if_run_create
from planning.selectors import (
    capacity_list,
    floor_list,
    forecast_list,
    plan_run_latest_done,
    plan_run_list,
    pool_plan_list,
)
from planning.tasks import plan_run_enqueue
from tenants.api.permissions import IsFinanceStaff

TAGS = ["plan"]

if TYPE_CHECKING:
    from planning.models import PlanRun


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
        try:
            run = what_if_run_create(params, user=request.user)
        except PlanRunMissing as exc:
            raise exceptions.NotFound(str(exc)) from None
        plan_run_enqueue(run.pk)
        return Response(PlanRunOut(run).data, status=status.HTTP_202_ACCEPTED)


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
