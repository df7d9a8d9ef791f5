"""Every REST route meets here, under /api/v1/."""

from django.urls import include, path

urlpatterns = [
    path("", include("tenants.api.urls")),
    path("", include("serving.api.urls")),
    path("", include("metering.api.urls")),
    path("", include("billing.api.urls")),
    path("", include("audit.api.urls")),
    path("", include("webhooks.api.urls")),
    path("", include("planning.urls")),
]
