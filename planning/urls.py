from django.urls import path, re_path

from planning.api import views as api

urlpatterns = [
    path("plan/runs", api.PlanRunListView.as_view(), name="plan-runs"),
    path("plan/runs/<int:pk>", api.PlanRunDetailView.as_view(), name="plan-run"),
    re_path(
        r"^plan/runs/(?P<pk>[0-9]+)/(?P<fmt>csv|html)$",
        api.PlanReportView.as_view(),
        name="plan-report",
    ),
    path("plan/what-ifs", api.WhatIfView.as_view(), name="plan-what-ifs"),
    path("plan/forecasts", api.ForecastListView.as_view(), name="plan-forecasts"),
    path("plan/capacities", api.CapacityListView.as_view(), name="plan-capacities"),
    path("plan/pools", api.PoolPlanListView.as_view(), name="plan-pools"),
    path("plan/floors", api.PriceFloorListView.as_view(), name="plan-floors"),
]
