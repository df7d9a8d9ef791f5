"""The cost API, for platform finance staff: dated cost rates, allocation
runs (queued to Celery, watched by status and progress), results by period
and tier / pool / tenant / model, cost per million tokens, utilization, and
what-if scenarios compared with the booked results."""

from __future__ import annotations

from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api import cost_serializers as s
from billing.costs.closing import cost_period_reopen
from billing.costs.rates import cost_rate_create, cost_rate_delete, cost_rate_update
from billing.costs.runs import allocation_run_create
from billing.costs.scenarios import cost_scenario_create, scenario_compare
from billing.costs.selectors import (
    cost_allocation_summary,
    cost_per_million_tokens,
    pool_utilization,
    unallocated_summary,
)
from billing.models import AllocationRun, CostPeriodReopening, CostRate, CostScenario
from billing.tasks import allocation_run_enqueue
from core.api_errors import validated
from tenants.api.permissions import IsFinanceStaff

TAGS = ["costs"]


class FinanceView(APIView):
    permission_classes = [IsFinanceStaff]


class CostRateListView(FinanceView):
    @extend_schema(
        summary="Booked cost rates, history included (newest first per component)",
        parameters=[s.CostRateQueryIn],
        responses={200: s.CostRateOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        rates = CostRate.objects.filter(scenario__isnull=True)
        if component := validated(s.CostRateQueryIn, request.query_params).get("component"):
            rates = rates.filter(component=component)
        return Response(s.CostRateOut(rates, many=True).data)

    @extend_schema(
        summary="Book a rate from a date (closes the open rate it replaces)",
        request=s.CostRateIn,
        responses={201: s.CostRateOut},
        tags=TAGS,
    )
    def post(self, request):
        rate = cost_rate_create(**validated(s.CostRateIn, request.data), user=request.user)
        return Response(s.CostRateOut(rate).data, status=status.HTTP_201_CREATED)


class CostReopeningListView(FinanceView):
    @extend_schema(
        summary="Closed cost periods reopened for dated rate changes (newest first)",
        responses={200: s.CostReopeningOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        reopenings = CostPeriodReopening.objects.select_related("reopened_by")
        return Response(s.CostReopeningOut(reopenings, many=True).data)

    @extend_schema(
        summary="Reopen part of the invoiced (closed) cost periods, with a reason",
        request=s.CostReopeningIn,
        responses={201: s.CostReopeningOut},
        tags=TAGS,
    )
    def post(self, request):
        reopening = cost_period_reopen(
            **validated(s.CostReopeningIn, request.data), user=request.user
        )
        return Response(s.CostReopeningOut(reopening).data, status=status.HTTP_201_CREATED)


class CostRateDetailView(FinanceView):
    def _rate(self, pk: int) -> CostRate:
        return get_object_or_404(CostRate, pk=pk, scenario__isnull=True)

    @extend_schema(responses={200: s.CostRateOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(s.CostRateOut(self._rate(pk)).data)

    @extend_schema(
        summary="Edit a rate not yet in effect",
        request=s.CostRateUpdateIn,
        responses={200: s.CostRateOut},
        tags=TAGS,
    )
    def patch(self, request, pk: int):
        changes = validated(s.CostRateUpdateIn, request.data)
        rate = cost_rate_update(rate=self._rate(pk), **changes)
        return Response(s.CostRateOut(rate).data)

    @extend_schema(
        summary="Withdraw a rate not yet in effect",
        responses={204: None},
        tags=TAGS,
    )
    def delete(self, request, pk: int):
        cost_rate_delete(rate=self._rate(pk))
        return Response(status=status.HTTP_204_NO_CONTENT)


class AllocationRunListView(FinanceView):
    @extend_schema(
        summary="Allocation runs, newest first, with status and progress",
        responses={200: s.AllocationRunOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        runs = AllocationRun.objects.all()[:200]
        return Response(s.AllocationRunOut(runs, many=True).data)

    @extend_schema(
        summary="Queue an allocation of a period (booked, or a scenario's)",
        request=s.AllocationRunIn,
        responses={202: s.AllocationRunOut},
        tags=TAGS,
    )
    def post(self, request):
        with transaction.atomic():
            run = allocation_run_create(
                **validated(s.AllocationRunIn, request.data), user=request.user
            )
            allocation_run_enqueue(run.pk)
        return Response(s.AllocationRunOut(run).data, status=status.HTTP_202_ACCEPTED)


class AllocationRunDetailView(FinanceView):
    @extend_schema(responses={200: s.AllocationRunOut}, tags=TAGS)
    def get(self, request, pk: int):
        return Response(s.AllocationRunOut(get_object_or_404(AllocationRun, pk=pk)).data)


class AllocationSummaryView(FinanceView):
    @extend_schema(
        summary="Allocated cost by period and tier, pool, tenant, model (any combination)",
        parameters=[s.AllocationQueryIn],
        responses={200: s.AllocationSummaryOut},
        tags=TAGS,
    )
    def get(self, request):
        q = validated(s.AllocationQueryIn, request.query_params)
        period = {"start": q["start"], "end": q["end"], "scenario": q.get("scenario")}
        body = {"results": cost_allocation_summary(group_by=q["group_by"], **period)}
        body["unallocated"] = (
            unallocated_summary(group_by=q["group_by"][0], **period)
            if q["group_by"] in (["tier"], ["pool"])
            else []
        )
        return Response(s.AllocationSummaryOut(body).data)


class CostPerTokenView(FinanceView):
    @extend_schema(
        summary="Cost per million tokens by model and pool",
        parameters=[s.PeriodIn],
        responses={200: s.CostPerTokenOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        q = validated(s.PeriodIn, request.query_params)
        rows = cost_per_million_tokens(start=q["start"], end=q["end"], scenario=q.get("scenario"))
        return Response(s.CostPerTokenOut(rows, many=True).data)


class UtilizationView(FinanceView):
    @extend_schema(
        summary="Utilization (busy / available device-seconds) by pool and hour",
        parameters=[s.UtilizationQueryIn],
        responses={200: s.UtilizationOut(many=True)},
        tags=TAGS,
    )
    def get(self, request):
        q = validated(s.UtilizationQueryIn, request.query_params)
        pool = q.get("pool")
        rows = pool_utilization(
            start=q["start"],
            end=q["end"],
            pool_id=pool.pk if pool else None,
            scenario=q.get("scenario"),
        )
        return Response(s.UtilizationOut(rows[:10_000], many=True).data)


class ScenarioListView(FinanceView):
    @extend_schema(responses={200: s.ScenarioOut(many=True)}, tags=TAGS)
    def get(self, request):
        scenarios = CostScenario.objects.prefetch_related("rates")
        return Response(s.ScenarioOut(scenarios, many=True).data)

    @extend_schema(
        summary="A what-if: re-allocate a past period under other rates or idle policy",
        request=s.ScenarioIn,
        responses={202: s.AllocationRunOut},
        tags=TAGS,
    )
    def post(self, request):
        with transaction.atomic():
            _, run = cost_scenario_create(
                **validated(s.ScenarioIn, request.data), user=request.user
            )
            allocation_run_enqueue(run.pk)
        return Response(s.AllocationRunOut(run).data, status=status.HTTP_202_ACCEPTED)


class ScenarioCompareView(FinanceView):
    @extend_schema(
        summary="A scenario against the booked results, by tenant, tier or pool",
        parameters=[s.CompareQueryIn],
        responses={200: s.CompareRowOut(many=True)},
        tags=TAGS,
    )
    def get(self, request, pk: int):
        scenario = get_object_or_404(CostScenario, pk=pk)
        by = validated(s.CompareQueryIn, request.query_params)["by"]
        rows = [{"key": row.pop(by), **row} for row in scenario_compare(scenario=scenario, by=by)]
        return Response(s.CompareRowOut(rows, many=True).data)
