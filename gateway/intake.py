"""The first stages of a request: who is calling (its API key), and what it
asks (its body, read and prepared for the replicas: gateway.payload)."""

from __future__ import annotations

from gateway.callers import Caller, CallerCache, CallerRefused
from gateway.errors import Refused
from gateway.exchange import Exchange, Receive, Rejected
from gateway.fleet import FleetSnapshot
from gateway.payload import BadRequest, prepare
from serving.records import MODEL_NAME_MAX
from tenants.keys import KEY_MAX_CHARS, key_parse

MAX_BODY_BYTES = 8 * 1024 * 1024
# All of a request's headers together: an OpenAI client sends well under
# 2 KiB; uvicorn's httptools parser sets no bound of its own (60 KB passed).
MAX_HEADER_BYTES = 16 * 1024


async def authenticate(callers: CallerCache, scope: dict) -> Caller:
    """The caller its bearer key names (CallerRefused: none, or not
    allowed). What cannot be a key (too long, not shaped like one) is
    refused here, before any cache or database sees it: junk costs nothing
    kept (issue 60: random 7 KB keys grew a gateway by 84 MiB)."""
    if sum(len(k) + len(v) for k, v in scope["headers"]) > MAX_HEADER_BYTES:
        raise CallerRefused(
            431, "headers_too_large", f"request headers over {MAX_HEADER_BYTES} bytes"
        )
    header = _header(scope, b"authorization")
    if header is None:
        raise CallerRefused(401, "missing_api_key", "missing 'Authorization: Bearer <key>'")
    scheme, _, token = header.decode(errors="replace").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise CallerRefused(401, "invalid_api_key", "Authorization must be 'Bearer <key>'")
    if len(token) > KEY_MAX_CHARS or key_parse(token) is None:
        raise CallerRefused(401, "invalid_api_key", "malformed API key")
    address = (scope.get("client") or ("",))[0]
    if callers.refusals.exhausted(address) and not callers.known(token):
        raise CallerRefused(
            429,
            "too_many_invalid_keys",
            "too many unknown API keys from this address: try again shortly",
            retry_after=1,
        )
    try:
        return await callers.get(token)
    except CallerRefused as refused:
        if refused.refused.status == 401:
            callers.refusals.spend(address)
        raise


async def parse(ex: Exchange, *, fleet: FleetSnapshot, default_max_tokens: int) -> None:
    """The request's body read and prepared (`ex.prepared`), or Rejected
    naming what is wrong with it."""
    try:
        raw = await read_body(ex.receive)
        ex.prepared = prepare(
            raw,
            kind=ex.kind,
            caller=ex.caller,
            fleet=fleet,
            default_max_tokens=default_max_tokens,
        )
    except BadRequest as bad:
        ex.record.model = bad.model[:MODEL_NAME_MAX]  # an unknown model too: what was asked
        refused = Refused(bad.status, bad.code, bad.message, param=bad.param)
        # A name the client made up never becomes a metrics label.
        unknown = bad.code == "model_not_found"
        raise Rejected(
            refused, error=bad.message, model_label="unknown" if unknown else None
        ) from None
    ex.record.model, ex.record.stream = ex.prepared.model, ex.prepared.stream


async def read_body(receive: Receive) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise BadRequest("client disconnected before sending the body", status=400)
        body = message.get("body", b"")
        size += len(body)
        if size > MAX_BODY_BYTES:
            raise BadRequest(f"request body over {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(body)
        if not message.get("more_body"):
            return b"".join(chunks)


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None
