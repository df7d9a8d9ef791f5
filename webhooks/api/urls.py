from django.urls import path

from webhooks.api import views

urlpatterns = [
    path("webhooks/endpoints", views.EndpointListView.as_view(), name="api-webhook-endpoints"),
    path(
        "webhooks/endpoints/<int:pk>",
        views.EndpointDetailView.as_view(),
        name="api-webhook-endpoint",
    ),
    path("webhooks/deliveries", views.DeliveryListView.as_view(), name="api-webhook-deliveries"),
    path(
        "webhooks/deliveries/<int:pk>",
        views.DeliveryDetailView.as_view(),
        name="api-webhook-delivery",
    ),
    path(
        "webhooks/deliveries/<int:pk>/redeliver",
        views.RedeliverView.as_view(),
        name="api-webhook-redeliver",
    ),
    path("alerts", views.AlertsView.as_view(), name="api-alerts"),
]
