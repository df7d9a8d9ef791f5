from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from core.csp import csp_allowing

urlpatterns = [
    path("", include("dashboard.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("config.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path(
        "api/redoc/",
        # Redoc's bundle adds style elements before it is given the nonce, and
        # runs its search in a worker made from a blob; scripts stay nonce-only.
        csp_allowing(
            SpectacularRedocView.as_view(url_name="api-schema"),
            style_src=["'unsafe-inline'"],
            worker_src=["blob:"],
            img_src=["https://cdn.redoc.ly"],
        ),
        name="api-redoc",
    ),
    path("", include("billing.urls")),
]

handler400 = "dashboard.views.bad_request"
handler404 = "dashboard.views.not_found"
handler500 = "dashboard.views.internal_error"
