"""Errors in OpenAI's shape, so the official client raises the right class."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

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
    422: "invalid_request_error",
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


# --- what a replica answered, in the same shape ------------------------------

# An upstream error body is relayed as it came only when it is OpenAI's own
# shape: one of OpenAI's types, a string code (or none). vLLM's ErrorResponse
# is close but not it (its type is an HTTP phrase or an exception's name, its
# code the status as a number), and its routes that do not exist answer
# FastAPI's {"detail": "Not Found"}.
OPENAI_ERROR_TYPES = frozenset(ERROR_TYPES.values()) | {"not_found_error", "invalid_request_error"}
# A pydantic error's type, as OpenAI names the same fault in its `code`.
VALIDATION_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unknown_parameter",
}
# Pieces of a pydantic `loc` that are its own wrappers and union branches,
# not a field the client wrote (vLLM drops the same).
LOC_WRAPPERS = frozenset(
    {"body", "function-wrap", "function-after", "function-before", "function-plain",
     "json-or-python", "lax-or-strict", "chain", "default", "nullable", "tagged-union",
     "union", "str", "int", "float", "bool", "list", "dict", "none"}
)  # fmt: skip
MESSAGE_MAX = 1000  # characters of an upstream message passed on
VALIDATION_LINE = re.compile(r"^(\d+) validation errors?:")
QUOTED_MSG = re.compile(r"""'msg': (['"])(.*?)\1""")


@dataclass(frozen=True)
class UpstreamFault:
    """A replica's error answer as the client gets it: its status, and
    OpenAI's error fields made from whatever shape the body had."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None
    kept: bytes = b""  # the body as it came, when it was already OpenAI's shape

    def body(self) -> bytes:
        return self.kept or error_body(self.status, self.message, code=self.code, param=self.param)

    def recorded(self) -> str:
        """For the ledger: the code first, as for the gateway's own refusals."""
        return (f"{self.code}: {self.message}" if self.code else self.message)[:300]


def upstream_fault(status: int, raw: bytes, *, route: str) -> UpstreamFault:
    """The error a replica answered (`raw`, with `status`, to `route`: "POST
    /v1/...") in OpenAI's error shape, keeping its status and its message,
    with `param` naming the field wherever the body says which (vLLM's
    validation errors: their `loc`)."""
    try:
        data: Any = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = raw.decode(errors="replace").strip()
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and _openai_shaped(error):
        return UpstreamFault(status, error["message"], error.get("code"), error.get("param"), raw)
    fields = error if isinstance(error, dict) else data if isinstance(data, dict) else {}
    detail = fields.get("message", fields.get("detail", error))
    if detail is None:
        detail = data if isinstance(data, str) else ""
    param = _param(fields.get("param")) if isinstance(fields.get("param"), str) else None
    problems, total = (detail, len(detail)) if isinstance(detail, list) else _problems(detail)
    if problems:
        return _validation_fault(status, problems, total, param)
    message = str(detail).strip()[:MESSAGE_MAX]
    phrase = _phrase(status)
    if message.removeprefix(f"{status}:").strip().lower() in ("", phrase.lower()):
        # FastAPI's own answer to a route or method it lacks: say which.
        message = f"the model server answered {status} {phrase} to {route}"
    if "maximum context length" in message:
        code = "context_length_exceeded"
    else:  # vLLM names the parameter whose value it refused
        code = "invalid_value" if param and status == 400 else None
    return UpstreamFault(status, message, code, param)


def _openai_shaped(error: dict) -> bool:
    return (
        isinstance(error.get("message"), str)
        and error.get("type") in OPENAI_ERROR_TYPES
        and isinstance(error.get("code"), str | None)
        and isinstance(error.get("param"), str | None)
    )


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _problems(message: Any) -> tuple[list[dict], int]:
    """vLLM's validation message ("22 validation errors:" then one pydantic
    error per line, each a Python dict's repr, the first ten of them) as
    those errors, and how many there were."""
    header = VALIDATION_LINE.match(message) if isinstance(message, str) else None
    if header is None:
        return [], 0
    problems = []
    for line in message.splitlines()[1:]:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            problem = ast.literal_eval(line)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            found = QUOTED_MSG.search(line)
            problem = {"msg": found.group(2)} if found else {}
        if isinstance(problem, dict):
            problems.append(problem)
    return problems, int(header.group(1))


def _validation_fault(status: int, problems: list, total: int, param: str | None) -> UpstreamFault:
    """The first of a request's validation errors (pydantic's: type, loc,
    msg, input), as OpenAI words one: "Invalid 'temperature': ..."."""
    first = problems[0] if isinstance(problems[0], dict) else {}
    loc = first.get("loc")
    param = _param(loc) if isinstance(loc, str | list | tuple) and loc else param
    kind = str(first.get("type") or "")
    code = VALIDATION_CODES.get(kind)
    if code is None:
        typed = kind.endswith(("_type", "_parsing")) or kind == "is_instance_of"
        code = "invalid_type" if typed else "invalid_value"
    message = str(first.get("msg") or "invalid value")
    if code == "missing_required_parameter" and param:
        message = f"Missing required parameter: '{param}'"
    elif param:
        message = f"Invalid '{param}': {message}"
        if "input" in first:  # what was sent (vLLM's own summary of it), cut short
            given = first["input"]
            if not isinstance(given, str):
                given = orjson.dumps(given, default=str).decode()
            message += f" (got {given[:100]!r})"
    if total > 1:  # most often the other branches of a union the value fits none of
        more = total - 1
        message += f" ({more} more validation error{'s' if more > 1 else ''})"
    return UpstreamFault(status, message[:MESSAGE_MAX], code, param)


def _param(loc: str | list | tuple) -> str | None:
    """A pydantic location as OpenAI names a parameter: "messages[0].content"
    for ("body", "messages", 0, "content") or vLLM's "body.messages.0.content"."""
    parts = loc.split(".") if isinstance(loc, str) else [str(p) for p in loc]
    name = ""
    for part in parts:
        # A union's branch is named by its model's class (vLLM's message
        # params: "ChatCompletionUserMessageParam"), never a field.
        if part.lower() in LOC_WRAPPERS or part[:1].isupper() or any(c in part for c in "[](){}"):
            continue
        if part.isdigit():
            name += f"[{part}]"
        else:
            name += f".{part}" if name else part
    return name or None
