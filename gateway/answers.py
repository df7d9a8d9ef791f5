"""The gateway's answers to its client: a whole one, a refusal, and an
error event inside a stream that has started."""

from __future__ import annotations

from gateway.errors import Refused, error_body
from gateway.outcome import Send
from gateway.sse import EVENT_END


async def respond(
    send: Send,
    status: int,
    body: bytes,
    headers: list | None = None,
    content_type: bytes = b"application/json",
) -> None:
    """A whole answer to the client: status, headers and body at once."""
    start_headers = [(b"content-type", content_type), *(headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": start_headers})
    await send({"type": "http.response.body", "body": body})


async def respond_refused(send: Send, refused: Refused, headers: list | None = None) -> None:
    """A refusal's answer, with what tells the client whether to retry."""
    await respond(send, refused.status, refused.body(), [*(headers or []), *refused.headers()])


async def error_event_send(send: Send, status: int, message: str, code: str) -> None:
    body = b"data: " + error_body(status, message, code=code) + EVENT_END
    await send({"type": "http.response.body", "body": body, "more_body": True})
