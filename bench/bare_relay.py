"""The least any proxy built like the gateway can cost: the gateway's own
server (uvicorn, uvloop, httptools) and its own client to replicas
(gateway.upstream_http), with nothing between them. Each request's body is
sent to one upstream as it came and the answer relayed as it comes: no
key, no admission, no queue, no metering, no usage edited out of a
stream. bench/gateway.py puts it beside the gateway at the ceiling: how
far the gateway's own work is from this floor, and how far this floor is
from calling the upstream straight.

    python -m bench.bare_relay --port 9001 --upstream http://127.0.0.1:9000
"""

from __future__ import annotations

import argparse

import uvicorn

from gateway.management.commands.gateway import SERVER_OPTIONS
from gateway.upstream_http import UpstreamClient

CONTENT_TYPE = b"content-type"


def relay_app(upstream: str):
    client = UpstreamClient(keepalive_seconds=60)

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await client.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["method"] == "GET":  # readiness
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        resp = await client.request(
            "POST",
            upstream + scope["path"],
            body,
            [(CONTENT_TYPE, b"application/json")],
            connect_timeout=5,
            read_timeout=60,
        )
        try:
            content_type = resp.headers.get("content-type", "application/json").encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": resp.status,
                    "headers": [(CONTENT_TYPE, content_type)],
                }
            )
            async for chunk in resp.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.release()

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="the upstream's base URL")
    args = parser.parse_args()
    uvicorn.run(
        relay_app(args.upstream.rstrip("/")),
        host="127.0.0.1",
        port=args.port,
        **SERVER_OPTIONS,
    )


if __name__ == "__main__":
    main()
