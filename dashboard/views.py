"""Health check and the error pages shared by the whole site."""

import hmac

from django.conf import settings
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.views.defaults import bad_request as page_bad_request
from django.views.defaults import page_not_found, server_error
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from core.api_errors import json_error

API_PREFIXES = ("/api/", "/v1/")
LOOPBACK = ("127.0.0.1", "::1")


def healthz(request):
    """Liveness plus a database round trip. A server the main job started
    echoes its instance token, so the job can tell it from another process
    on the same port."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()
    health = {"status": "ok", "database": connection.vendor}
    if settings.SERVER_INSTANCE:
        health["instance"] = settings.SERVER_INSTANCE
    return JsonResponse(health)


def metrics(request):
    """Prometheus exposition of the platform's own state (the gateway
    serves its per-request metrics itself): operators only. With
    METRICS_TOKEN set, the scraper sends it as a bearer token (compared in
    constant time); without one, only a caller on this machine (loopback)
    is answered, since the figures name tenants, replicas and jobs."""
    token = settings.METRICS_TOKEN
    if token:
        sent = request.headers.get("Authorization", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
            return json_error(
                status_code=401, code="unauthorized", message="metrics token required"
            )
    elif request.META.get("REMOTE_ADDR") not in LOOPBACK:
        return json_error(
            status_code=403,
            code="forbidden",
            message="/metrics answers this machine only: set METRICS_TOKEN to scrape it from "
            "elsewhere",
        )
    from billing.spend.corrections import SpendDriftCollector
    from dashboard.jobs import JobsCollector
    from metering.telemetry import MeteringCollector

    registry = CollectorRegistry(auto_describe=False)
    registry.register(MeteringCollector())
    registry.register(JobsCollector())
    registry.register(SpendDriftCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def bad_request(request, exception=None):
    """A request Django refuses before any view (a Host header it does not
    allow, a malformed one): JSON on the API, the plain 400 page elsewhere."""
    if request.path.startswith(API_PREFIXES):
        return json_error(status_code=400, code="bad_request", message="malformed request")
    return page_bad_request(request, exception)


def not_found(request, exception=None):
    if request.path.startswith(API_PREFIXES):
        return json_error(status_code=404, code="not_found", message="no such endpoint")
    return page_not_found(request, exception)


def internal_error(request):
    if request.path.startswith(API_PREFIXES):
        return json_error(status_code=500, code="server_error", message="internal error")
    return server_error(request)
