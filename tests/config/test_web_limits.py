"""Nobody anonymous makes the web app read their bytes (issue 60, finding
4), attacked as an attacker would: against the web app as uvicorn runs it,
an anonymous POST declaring a 1 GiB body is a 413 before a byte of it is
read, and one streaming 1 GiB chunked is cut at the 16 MiB bound, with the
server's memory flat; an anonymous caller is a 401 before any parsing,
where it was a 404 after parsing its body."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from core.processes import ManagedProcess, database_url_for_subprocess, uvicorn_argv
from tests.services import free_port

GIB = 1024**3


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def _send(port: int, head: bytes, chunks=()) -> tuple[bytes, int]:
    """What the server answered, and how many body bytes it took first."""
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
                sent += len(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed it: what it answered is waiting
        sock.settimeout(30)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer:
                got = sock.recv(65536)
                if not got:
                    break
                answer += got
        except ConnectionResetError:
            pass
    return answer, sent


def _chunked(total: int, size: int = 1024 * 1024):
    piece = b"%x\r\n" % size + b"x" * size + b"\r\n"
    for _ in range(total // size):
        yield piece


@pytest.mark.slow
@pytest.mark.django_db
def test_an_anonymous_gigabyte_is_refused_early_with_the_servers_memory_flat(tmp_path):
    port = free_port()
    web = ManagedProcess(
        name="web-limits",
        argv=uvicorn_argv("config.asgi:application", host="127.0.0.1", port=port),
        env={"DATABASE_URL": database_url_for_subprocess(), "REDIS_URL": ""},
        log_path=tmp_path / "web.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    web.start()
    try:
        web.wait_ready(timeout=60)
        before = _rss(web.pid)
        post = b"POST /api/v1/api-keys HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        post += b"Content-Type: application/json\r\n"
        began = time.monotonic()
        declared, _ = _send(port, post + b"Content-Length: %d\r\n\r\n" % GIB)
        took = time.monotonic() - began
        streamed, sent = _send(port, post + b"Transfer-Encoding: chunked\r\n\r\n", _chunked(GIB))
        after = _rss(web.pid)
    finally:
        web.stop()
    assert declared.startswith(b"HTTP/1.1 413 ") and took < 5, declared[:200]
    assert b"request_too_large" in declared or b"content-length" in declared.lower()
    assert streamed.startswith(b"HTTP/1.1 413 "), streamed[:200]
    assert sent < 256 * 1024 * 1024  # cut near its 16 MiB, not read to its end
    assert after - before < 64 * 1024 * 1024, f"grew {(after - before) / 2**20:.0f} MiB"


def test_an_anonymous_caller_is_a_401_before_its_body_is_parsed(client):
    answer = client.post("/api/v1/api-keys", data="{not json", content_type="application/json")
    assert answer.status_code == 401, answer.content  # was 404, after parsing
