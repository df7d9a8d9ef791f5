"""How the operator listener (gateway.operator) asks each gateway worker
for what only the worker knows: its detailed health, and its scrape-time
gauges set before a scrape.

Each worker listens on a Unix socket of its own, `<pid>.sock` in the
directory `manage.py gateway` names in GATEWAY_OPERATOR_CHANNEL_DIR (a
private temporary directory, mode 0700: only the gateway's own user can
connect). A question is one line (a command), the answer one JSON object,
then the worker closes the connection. Not a TCP port: nothing outside the
gateway's own processes can reach it, and a worker needs no port number
(uvicorn's workers do not know which of them they are).

A gateway app started without `manage.py gateway` (no directory named)
opens no channel and has no operator endpoints."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path

import orjson

logger = logging.getLogger("gateway")

CHANNEL_DIR_ENV = "GATEWAY_OPERATOR_CHANNEL_DIR"
ASK_SECONDS = 5.0  # a worker whose loop is stalled longer is reported as not answering


class WorkerChannel:
    """A worker's end: answers `handlers[command]()` as JSON."""

    def __init__(self, server: asyncio.AbstractServer, path: Path) -> None:
        self.server = server
        self.path = path

    @classmethod
    async def open(cls, handlers: dict[str, Callable[[], dict]]) -> WorkerChannel | None:
        directory = os.environ.get(CHANNEL_DIR_ENV)
        if not directory:
            return None
        path = Path(directory) / f"{os.getpid()}.sock"

        async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                command = (await asyncio.wait_for(reader.readline(), ASK_SECONDS)).strip()
                handler = handlers.get(command.decode(errors="replace"))
                body = handler() if handler else {"error": f"no command {command!r}"}
                writer.write(orjson.dumps(body))
                await writer.drain()
            except Exception:  # one bad question never takes the worker down
                logger.exception("operator channel: could not answer")
            finally:
                writer.close()

        server = await asyncio.start_unix_server(answer, path=str(path))
        return cls(server, path)

    async def close(self) -> None:
        self.server.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class WorkerGone(Exception):
    """The worker behind a socket is not answering (exited, or stalled)."""


def worker_sockets(directory: Path) -> dict[int, Path]:
    """Every worker socket in the channel directory, by process id."""
    found = {}
    for path in directory.glob("*.sock"):
        with contextlib.suppress(ValueError):
            found[int(path.stem)] = path
    return dict(sorted(found.items()))


def worker_ask(path: Path, command: str, *, timeout: float = ASK_SECONDS) -> dict:
    """One question to one worker (blocking: the operator listener's
    threads ask); WorkerGone when it does not answer in `timeout`."""
    chunks = []
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(command.encode() + b"\n")
            while chunk := sock.recv(65536):
                chunks.append(chunk)
    except OSError as exc:  # refused (it exited), timed out (stalled), reset
        raise WorkerGone(f"{type(exc).__name__}: {exc}") from exc
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError as exc:
        raise WorkerGone("closed without an answer") from exc
