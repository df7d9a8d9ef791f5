"""One error shape for every API response:

    {"error": {"code": "...", "message": "...", "field": "name" | null,
               "details": [{"field": ..., "code": ..., "message": ...}, ...]}}

`field` names the first offending input; `details` lists them all.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import IntegrityError
from django.http import Http404, JsonResponse, QueryDict
from rest_framework import exceptions, serializers, status
from rest_framework.fields import get_error_detail
from rest_framework.views import exception_handler as drf_exception_handler

from core.db_errors import database_away
from core.errors import ConflictError, InputError
from core.outages import database_outage_report

logger = logging.getLogger(__name__)


def validated(serializer_class, data, **kwargs) -> dict:
    """`data` through an input serializer: its validated data, or a 400
    naming each offending field (raised). A request's body (a dict or list:
    the API parses JSON only) may carry no field the serializer does not
    take, nested ones included: a misspelt field ("drafts" for "finalize")
    is a 400 naming it, never ignored in favour of a default. A query
    string (a QueryDict) may carry others."""
    serializer = serializer_class(data=data, **kwargs)
    if not isinstance(data, QueryDict):
        unknown = {
            name: [f"unknown field: this request takes {', '.join(taken) or 'none'}"]
            for name, taken in unknown_fields(serializer, data)
        }
        if unknown:
            raise exceptions.ValidationError(unknown)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def unknown_fields(field, data, *, path: str | None = None):
    """(name, the names taken there) for each key of `data`, at any depth,
    that `field` (a serializer) has no field for; names as the API's
    errors give them (nested ones joined with dots, list items by index)."""
    if isinstance(field, serializers.ListSerializer | serializers.ListField):
        if isinstance(data, list):
            for index, item in enumerate(data):
                yield from unknown_fields(field.child, item, path=_join(path, str(index)))
    elif isinstance(field, serializers.Serializer) and isinstance(data, Mapping):
        fields = field.fields
        for key, value in data.items():
            name = _join(path, str(key))
            if key in fields:
                yield from unknown_fields(fields[key], value, path=name)
            else:
                yield name, sorted(n for n, f in fields.items() if not f.read_only)


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "the request conflicts with the current state"
    default_code = "conflict"


class DatabaseUnavailable(exceptions.APIException):
    """The database could not be reached: stopped, restarting, the network
    gone, or no pooled connection in time. The transaction the request had
    open is lost with its connection; a request written in one transaction
    and idempotent, as a usage batch is, may be sent again as it was."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "the database is unavailable: try again shortly"
    default_code = "database_unavailable"
    wait = 1  # Retry-After, as the gateway's database_unavailable says


def api_exception_handler(exc: Exception, context: dict[str, Any]):
    exc = _as_api_exception(exc)
    response = drf_exception_handler(exc, context)
    if response is None:
        return None  # an unexpected error: Django's 500 handling and logging
    response.data = {"error": error_body(exc)}
    if isinstance(exc, DatabaseUnavailable):
        response._has_been_logged = True  # the outage's episode line says it once
    return response


def _as_api_exception(exc: Exception) -> Exception:
    if isinstance(exc, DjangoValidationError):
        return exceptions.ValidationError(detail=get_error_detail(exc))
    if isinstance(exc, ObjectDoesNotExist | Http404):
        return exceptions.NotFound()
    if isinstance(exc, DjangoPermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, ConflictError):
        return Conflict(str(exc), code=exc.code)
    if isinstance(exc, InputError):
        return exceptions.ValidationError({exc.field: [exc.message]})
    if database_away(exc):
        # One line per outage (core.outages), not one per request.
        database_outage_report(exc, doing="the API")
        return DatabaseUnavailable()
    if isinstance(exc, IntegrityError):  # a constraint a serializer did not check first
        return Conflict(_integrity_message(exc), code="constraint_violated")
    return exc


def _integrity_message(exc: IntegrityError) -> str:
    diag = getattr(getattr(exc, "__cause__", None), "diag", None)
    constraint = getattr(diag, "constraint_name", None)
    if constraint:
        return f"the change violates constraint {constraint}"
    return "the change conflicts with existing data"


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    details = list(_flatten(exc.detail, field=None))
    first = details[0] if details else {"field": None, "code": "error", "message": str(exc)}
    body = {"code": first["code"], "message": first["message"], "field": first["field"]}
    if isinstance(exc, exceptions.ValidationError):
        if first["field"]:
            body["message"] = f"{first['field']}: {first['message']}"
        body["details"] = details
    return body


def api_error_items(detail: Any):
    """Each error of a serializer's `errors` as the API names it: field
    (nested fields joined with dots), code and message."""
    yield from _flatten(detail, field=None)


def _flatten(detail: Any, *, field: str | None):
    if isinstance(detail, dict):
        for key, value in detail.items():
            sub = None if key in ("non_field_errors", "__all__") else str(key)
            yield from _flatten(value, field=_join(field, sub))
    elif isinstance(detail, list):
        for index, value in enumerate(detail):
            nested = isinstance(value, dict | list)
            yield from _flatten(value, field=_join(field, str(index)) if nested else field)
    else:
        yield {
            "field": field,
            "code": getattr(detail, "code", None) or "invalid",
            "message": str(detail),
        }


def _join(parent: str | None, child: str | None) -> str | None:
    if parent and child:
        return f"{parent}.{child}"
    return parent or child


def json_error(*, status_code: int, code: str, message: str) -> JsonResponse:
    return JsonResponse(
        {"error": {"code": code, "message": message, "field": None}}, status=status_code
    )


class ErrorDetailOut(serializers.Serializer):
    field = serializers.CharField(allow_null=True)
    code = serializers.CharField()
    message = serializers.CharField()


class ErrorBodyOut(ErrorDetailOut):
    details = ErrorDetailOut(many=True, required=False)


class ErrorOut(serializers.Serializer):
    """The shape of every API error."""

    error = ErrorBodyOut()
