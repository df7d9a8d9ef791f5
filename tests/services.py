"""Real services the tests need, found on this machine or started by them.

A test that needs a service it cannot find skips locally, but under CI=true
the same absence fails the run: a green CI must mean the test really ran."""

from __future__ import annotations

import os
import socket

import pytest

from core.processes import database_url_for_subprocess, free_port  # noqa: F401 (re-exported)

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


def database_session(*, autocommit: bool = False):
    """A second session on the test database (a psycopg connection of its
    own: what another process holding locks or rows looks like)."""
    import psycopg
    from django.db import connection

    s = connection.settings_dict
    return psycopg.connect(
        host=str(s["HOST"]),
        port=s["PORT"] or None,
        user=s["USER"],
        password=s["PASSWORD"] or None,
        dbname=s["NAME"],
        autocommit=autocommit,
    )
