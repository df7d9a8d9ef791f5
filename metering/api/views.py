"""The metering API: batch ingestion of usage events from serving tiers
that are not ours, and usage exports (JSON, CSV). The FOCUS export, with
costs, is billing's (billing.api.focus)."""

from __future__ import annotations

from itertools import islice

import orjson
from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import APIView

from core.api_download import DownloadView
from core.api_time import utc_iso
from core.csv_stream import csv_response
from metering.api.cursors import usage_page
from metering.api.serializers import (
    UsageBatchIn,
    UsageBatchOut,
    UsageBatchQueuedOut,
    UsagePageOut,
    UsageQueryIn,
    UsageRowOut,
)
from metering.choices import EventSource
from metering.ledger import BatchRejected, usage_record_batch, usage_rows_validate
from metering.selectors.queue import gateway_queue_ms_mean
from metering.selectors.usage import SUMS, UsageQuery, usage_energy, usage_summary
from metering.validation import LEDGER_COLUMNS
from tenants.api.permissions import (
    IsUsageReporter,
    scope_required,
    tenant_scope,
)
from tenants.models import Tenant

NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")

EXAMPLE_EVENT = {
    "request_id": "edge-7f3a2c",
    "tenant": "acme",
    "model": "llama-3.1-8b",
    "replica": "eu-west-vllm-3",
    "prompt_tokens": 812,
    "cached_tokens": 512,
    "completion_tokens": 96,
    "received_at": "2026-11-21T10:15:02.120Z",
    "sent_at": "2026-11-21T10:15:02.121Z",
    "ended_at": "2026-11-21T10:15:03.900Z",
    "queue_ms": 3.2,
    "ttft_ms": 41.7,
    "generation_ms": 1730.0,
    "timing": "engine",
    "gateway_queue_ms": 0.8,
    "status": "ok",
    "http_status": 200,
}


def _parse_events(request) -> list:
    """The events in the body: {"events": [...]}, a bare JSON array, or
    NDJSON (one event per line). Parsed with orjson: no serializer per item."""
    body = request.body
    content_type = (request.content_type or "").split(";")[0].strip().lower()
    try:
        if content_type in NDJSON_TYPES:
            events = [orjson.loads(line) for line in body.splitlines() if line.strip()]
        else:
            payload = orjson.loads(body)
            events = payload.get("events") if isinstance(payload, dict) else payload
    except orjson.JSONDecodeError as exc:
        raise exceptions.ParseError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(events, list):
        raise exceptions.ValidationError({"events": ["a list of usage events is required"]})
    limit = settings.METERING["INGEST_MAX_EVENTS"]
    if not events or len(events) > limit:
        raise exceptions.ValidationError({"events": [f"send 1 to {limit} events per request"]})
    return events


class UsageEventIngestView(APIView):
    permission_classes = [IsUsageReporter]
    parser_classes: list = []  # the body is read raw (JSON or NDJSON), see _parse_events

    @extend_schema(
        summary="Report usage events (up to 1,000) from another serving tier",
        description=(
            "Authenticated by a platform service key (`Authorization: Bearer gls_...`, "
            'created with `manage.py service_key_create`). The body is `{"events": [...]}`, '
            "a JSON array, or NDJSON (`Content-Type: application/x-ndjson`). Idempotent: an "
            "event whose request_id was recorded before is a `duplicate`, not an error. "
            "All-or-nothing: if any event is invalid the answer is 400, every bad event is "
            "named with its field, and nothing of the batch is written. While the database "
            "is unavailable the answer is 503 `database_unavailable` with Retry-After; after "
            "a 503 or a timeout, send the same batch again: what was recorded comes back as "
            "`duplicate`. On the scaled usage path (the deployment's `USAGE_LOG_URL`) a valid "
            "batch is answered 202, every event `queued`, once the usage log holds it (the "
            "store keeps each request id once, so a batch sent again changes nothing); 503 "
            "`usage_log_unavailable` while the log cannot take it."
        ),
        request=UsageBatchIn,
        responses={200: UsageBatchOut, 202: UsageBatchQueuedOut},
        examples=[
            OpenApiExample("A batch of one", value={"events": [EXAMPLE_EVENT]}, request_only=True),
            OpenApiExample(
                "Recorded",
                value={
                    "accepted": 1,
                    "duplicates": 0,
                    "results": [{"index": 0, "request_id": "edge-7f3a2c", "status": "accepted"}],
                },
                response_only=True,
                status_codes=["200"],
            ),
        ],
        tags=["usage"],
    )
    def post(self, request):
        events = _parse_events(request)
        if settings.USAGE_LOG["URL"]:
            return _queued_response(events)
        try:
            result = usage_record_batch(events=events, source=EventSource.API)
        except BatchRejected as rejected:
            return _rejected_response(events, rejected)
        results = [
            {"index": index, "request_id": request_id, "status": item_status}
            for index, (request_id, item_status) in enumerate(
                zip(result.request_ids, result.statuses, strict=True)
            )
        ]
        body = {
            "accepted": result.accepted_count,
            "duplicates": result.duplicate_count,
            "results": results,
        }
        return Response(body, status=status.HTTP_200_OK)


class UsageLogUnavailable(exceptions.APIException):
    """The scaled path's usage log did not acknowledge the batch: nothing
    of it is taken; send the same batch again (the same events are kept
    once)."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the usage log is unavailable: send the same batch again shortly"
    default_code = "usage_log_unavailable"
    wait = 1


def _queued_response(events: list) -> Response:
    """The scaled path (USAGE_LOG_URL): the batch validated as the ledger
    validates it (a 400 naming every bad event, nothing published), then
    published to the usage log and answered 202 once the log holds it.
    Whether an event was recorded before is settled downstream: the
    store keeps each (request id, phase) once."""
    from metering.log.publisher import usage_log_events
    from serving.records import SinkUnavailable

    try:
        rows = usage_rows_validate(events=events, source=EventSource.API)
    except BatchRejected as rejected:
        return _rejected_response(events, rejected)
    try:
        usage_log_events([dict(zip(LEDGER_COLUMNS, row, strict=True)) for row in rows])
    except SinkUnavailable:
        raise UsageLogUnavailable() from None
    results = [
        {"index": index, "request_id": row[0], "status": "queued"} for index, row in enumerate(rows)
    ]
    return Response({"queued": len(rows), "results": results}, status=status.HTTP_202_ACCEPTED)


def _rejected_response(events: list, rejected: BatchRejected) -> Response:
    bad = {e.index: e for e in rejected.errors}
    results = []
    for index, event in enumerate(events):
        request_id = event.get("request_id") if isinstance(event, dict) else None
        item = {"index": index, "request_id": request_id, "status": "not_written"}
        if index in bad:
            item.update(status="rejected", field=bad[index].field, reason=bad[index].message)
        results.append(item)
    details = [
        {"field": f"events.{e.index}.{e.field}", "code": "invalid", "message": e.message}
        for e in rejected.errors
    ]
    first = details[0]
    body = {
        "error": {
            "code": "invalid_events",
            "message": (
                f"{len(details)} of {len(events)} events are invalid; nothing was written. "
                f"First: {first['field']}: {first['message']}"
            ),
            "field": first["field"],
            "details": details,
        },
        "results": results,
    }
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


def _usage_request(request, parameters) -> tuple[dict, Tenant | None, UsageQuery]:
    """Validated query parameters, whose rows the caller may read, and the query."""
    query_in = parameters(data=request.query_params)
    query_in.is_valid(raise_exception=True)
    params = query_in.validated_data
    query = UsageQuery(
        start=params["start"],
        end=params["end"],
        group_by=params["group_by"],
        model=params.get("model"),
    )
    return params, tenant_scope(request, params.get("tenant")), query


# Requests that named no model the platform serves (a malformed body, a
# model missing or unknown: refused before reaching a replica) are kept, a
# row of their own under this name: a tenant sees what it sent and what
# was refused, rather than a row with a blank model.
UNKNOWN_MODEL = "(unknown)"
# How often the metering job refreshes the hourly rollups the export reads
# (config/schedule.py, "metering-run"): a completed request shows here
# within this long (half of it on average), as the description says.
ROLLUP_REFRESH_SECONDS = 60


def _usage_row(row: dict, energy: dict) -> dict:
    requests = sum(row[f"requests_{s}"] for s in ("ok", "aborted", "error", "rejected"))
    kwh, co2e = energy.get((row["period"], row["tenant_id"], row["model_key"]), (None, None))
    return {
        # One format in JSON and CSV: ISO 8601 in UTC with a "Z".
        "period_start": utc_iso(row["period"]),
        "tenant": row["tenant_slug"],
        "model": row["model_name"] or UNKNOWN_MODEL,
        "requests": requests,
        **{name: row[name] for name in SUMS},
        "gateway_queue_ms_mean": gateway_queue_ms_mean(
            total_ms=row["gateway_queue_ms_sum"], requests=row["gateway_queue_requests"]
        ),
        "energy_kwh": kwh,
        "co2e_g": co2e,
    }


def _usage_rows(rows, query, *, batch: int = 2000):
    """Export rows with their energy, read a batch of rows at a time."""
    rows = iter(rows)
    while chunk := list(islice(rows, batch)):
        energy = usage_energy(chunk, query=query)
        yield from (_usage_row(r, energy) for r in chunk)


USAGE_CSV_COLUMNS = list(UsageRowOut().fields)


class UsageExportView(DownloadView):
    permission_classes = [scope_required("usage:read")]

    @extend_schema(
        summary="Usage by period, tenant and model (from hourly rollups)",
        description=(
            "A tenant's credential (an API key with `usage:read`, or a member's session) "
            "reads its own usage; finance staff read every tenant's, or one with `tenant`. "
            "JSON pages follow `next_cursor`; `format=csv` streams the whole range, the "
            "same columns with the same values: `period_start` is ISO 8601 in UTC "
            "(`2026-11-21T10:00:00Z`) in both.\n\n"
            f"Requests that named no model served here (a malformed body, a missing or "
            f"unknown model: refused with a 4xx before reaching a replica) are a row of "
            f"their own with model `{UNKNOWN_MODEL}`, counted in `requests_rejected` or "
            f"`requests_error`.\n\n"
            f"Freshness: rows come from the hourly rollups, which the metering job "
            f"refreshes every {ROLLUP_REFRESH_SECONDS} seconds, so a completed request "
            f"appears here within about {ROLLUP_REFRESH_SECONDS} seconds of the SDK call "
            f"returning ({ROLLUP_REFRESH_SECONDS // 2} s on average; the gateway writes it "
            f"to the ledger within a fraction of a second). Its device-seconds and energy "
            f"follow once its attribution window has closed and the grace for late records "
            f"(METERING_ATTRIBUTION_GRACE_SECONDS, 120 s by default) has passed."
        ),
        parameters=[UsageQueryIn],
        responses={
            (200, "application/json"): UsagePageOut,
            (200, "text/csv"): OpenApiTypes.BINARY,
        },
        tags=["usage"],
    )
    def get(self, request):
        params, tenant, query = _usage_request(request, UsageQueryIn)
        if params["format"] == "csv":
            rows = _usage_rows(usage_summary(tenant=tenant, query=query).iterator(2000), query)
            name = f"usage-{query.start:%Y%m%d}-{query.end:%Y%m%d}.csv"
            return csv_response(rows, columns=USAGE_CSV_COLUMNS, filename=name)
        try:
            rows, next_cursor = usage_page(
                tenant=tenant, query=query, limit=params["limit"], cursor=params.get("cursor")
            )
        except ValueError as exc:
            raise exceptions.ValidationError({"cursor": [str(exc)]}) from None
        body = {"results": list(_usage_rows(rows, query)), "next_cursor": next_cursor}
        return Response(UsagePageOut(body).data)
