"""The gateway's ASGI application, as uvicorn imports it
(`manage.py gateway` names "gateway.app:application"): Django set up, then
one process object (gateway.process) that starts and stops with the
server's lifespan and answers its HTTP requests."""

from __future__ import annotations

import logging
import os
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
django.setup()

from gateway.process import Gateway  # noqa: E402

logger = logging.getLogger("gateway")

gateway = Gateway()


async def application(scope: dict[str, Any], receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await gateway.startup()
                except Exception as exc:
                    logger.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await gateway.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return
    elif scope["type"] == "http":
        await gateway.handle(scope, receive, send)
