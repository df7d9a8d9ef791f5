"""A request body bound at the web server, before Django reads a byte of
it (issue 60, finding 4). Django's ASGI handler reads a whole body into a
spooled file (memory, then disk) before any view runs, and DRF's parser
reads the stream without Django's upload cap; uvicorn sets no limit. A
declared Content-Length over the bound is a 413 at once; a body sent
without one (chunked) is counted as it arrives and cut at the bound."""

from __future__ import annotations

import json


class _TooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            await self._refuse(send)
            return
        seen, started = 0, False

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def sending(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, sending)
        except _TooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send) -> None:
        body = json.dumps(
            {
                "error": {
                    "code": "request_too_large",
                    "message": f"request body over {self.max_bytes} bytes",
                    "field": None,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
