"""Health check and the error pages shared by the whole site."""

from django.db import connection
from django.http import JsonResponse
from django.views.defaults import page_not_found, server_error

from config.api_errors import json_error

API_PREFIXES = ("/api/", "/v1/")


def healthz(request):
    """Liveness plus a database round trip."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    return JsonResponse({"status": "ok", "database": connection.vendor})


def not_found(request, exception=None):
    if request.path.startswith(API_PREFIXES):
        return json_error(status_code=404, code="not_found", message="no such endpoint")
    return page_not_found(request, exception)


def internal_error(request):
    if request.path.startswith(API_PREFIXES):
        return json_error(status_code=500, code="server_error", message="internal error")
    return server_error(request)
