"""Errors in OpenAI's shape, so the official client raises the right class."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
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


# The statuses the official openai SDK retries by itself (twice by default),
# unless the answer says `x-should-retry: false`.
CLIENT_RETRIED = frozenset({408, 409, 429})


def retry_headers(status: int, retry_after: int | None) -> list[tuple[bytes, bytes]]:
    """What tells a client whether sending the request again can help: a
    refusal that waiting can lift says when (Retry-After); one that no wait
    lifts, answered with a status clients retry by themselves (408, 409,
    429, 5xx), says `x-should-retry: false`, which the openai SDK obeys."""
    if retry_after is not None:
        return [(b"retry-after", str(retry_after).encode())]
    if status in CLIENT_RETRIED or status >= 500:
        return [(b"x-should-retry", b"false")]
    return []


@dataclass(frozen=True)
class Refused:
    """The answer to a request that may not run (now). `retry_after`
    (seconds) when waiting can lift it, None when no wait can."""

    status: int
    code: str
    message: str
    retry_after: int | None = None
    param: str | None = None

    def body(self) -> bytes:
        return error_body(self.status, self.message, code=self.code, param=self.param)

    def headers(self) -> list[tuple[bytes, bytes]]:
        return retry_headers(self.status, self.retry_after)
