"""The OpenAPI schema as typed clients need it: every operation lists the
errors any operation can answer, in the one error shape (core.api_errors),
so a generated client has a type for each and a schema-driven test can
hold the API to its schema."""

from __future__ import annotations

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiResponse

from core.api_errors import ErrorOut

COMMON_ERRORS = {
    "400": "Invalid input: `error.field` names the first offending field, `details` all of them.",
    "401": "No credential, or one that is not valid (an API key or a session).",
    "403": "The credential may not do this (a tenant's key on finance's data, a viewer's write).",
    "404": "Not found, or not visible to this credential.",
    "405": "The method is not allowed on this path.",
    "406": "The format asked for (`format` or Accept) is not one this operation serves.",
    "409": "Conflicts with the current state (a unique name taken, an invoice already final).",
    "415": "The body is not JSON.",
    "503": "The database is unavailable (`database_unavailable`): send the same request again "
    "after Retry-After; a write was either committed whole or not at all.",
}
BODYLESS = {"GET", "DELETE", "HEAD"}
# An exact amount sent as a decimal string ("893.31"), never a float: how
# drf-spectacular declares a DecimalField, for fields that format their own.
DECIMAL_STRING = {"type": "string", "format": "decimal", "pattern": r"^-?\d+(?:\.\d+)?$"}


class ApiAutoSchema(AutoSchema):
    """drf-spectacular's schema, with COMMON_ERRORS on every operation (an
    operation's own description of one of them wins)."""

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code, description in COMMON_ERRORS.items():
            if code == "415" and self.method in BODYLESS:
                continue
            if code not in responses:
                responses[code] = self._get_response_for_code(
                    OpenApiResponse(ErrorOut, description=description),
                    code,
                    ["application/json"],
                    direction,
                )
        return responses
