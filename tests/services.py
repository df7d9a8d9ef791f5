"""Real services the tests need, found on this machine or started by them.

A test that needs a service it cannot find skips locally, but under CI=true
the same absence fails the run: a green CI must mean the test really ran."""

from __future__ import annotations

import os
import socket
from urllib.parse import quote

import pytest
from django.db import connection

from config.processes import free_port  # noqa: F401 (tests import it from here)

IN_CI = os.environ.get("CI") == "true"


def require(condition: bool, reason: str) -> None:
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required under CI=true: {reason}", pytrace=False)
    pytest.skip(reason)


def port_answers(host: str, port: int, *, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def redis_url() -> str | None:
    """REDIS_URL, else the machine's Redis on loopback when it answers."""
    url = os.environ.get("REDIS_URL")
    if url:
        return url
    if port_answers("127.0.0.1", 6379):
        return "redis://127.0.0.1:6379/15"
    return None


def database_url_for_subprocess() -> str:
    """A DATABASE_URL naming the database this test process is using (the
    test database), so a worker or server we start sees the same rows."""
    s = connection.settings_dict
    connection.ensure_connection()  # the embedded backend fills HOST/PORT on connect
    user = quote(s["USER"], safe="")
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    host = str(s["HOST"])
    if host.startswith("/"):  # a Unix socket directory travels in the path (django-environ)
        return f"postgres://{user}{password}@/{quote(host, safe='')}/{s['NAME']}"
    return f"postgres://{user}{password}@{host}:{s['PORT']}/{s['NAME']}"
