from django.urls import path

from metering.api import views

urlpatterns = [
    path("usage", views.UsageExportView.as_view(), name="usage"),
    path("usage/events", views.UsageEventIngestView.as_view(), name="usage-events"),
]
