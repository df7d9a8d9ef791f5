"""Errors in OpenAI's shape, so the official client raises the right class."""

from __future__ import annotations

import orjson

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "upstream_timeout",
}


def error_body(
    status: int, message: str, *, code: str | None = None, param: str | None = None
) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": message,
                "type": ERROR_TYPES.get(status, "error"),
                "param": param,
                "code": code,
            }
        }
    )
