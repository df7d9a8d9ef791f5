"""Real services the tests need, found on this machine or started by them.

A test that needs a service it cannot find skips locally, but under CI=true
the same absence fails the run: a green CI must mean the test really ran."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit, urlunsplit

import pytest

from core import processes
from core.processes import database_url_for_subprocess  # noqa: F401 (re-exported)

IN_CI = os.environ.get("CI") == "true"

# Under pytest-xdist each worker is a process of its own ("gw0", "gw1", ...);
# pytest-django gives each its own test database (test_<name>_gw0, ...).
# What else the workers could share is split here: ports and Redis.
WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
WORKER_INDEX = int(WORKER.removeprefix("gw")) if WORKER.startswith("gw") else 0
REDIS_DATABASES = 16  # Redis's default `databases`
REDIS_SCRATCH_DB = 15  # the machine's Redis without REDIS_URL: its last database


def free_port() -> int:
    """A port free on loopback now (core.processes.free_port), and one only
    this worker chooses: core's picks at random from a range every worker
    shares, so two workers starting servers at the same moment could pick
    the same port. Each worker keeps to the ports whose number modulo the
    number of workers is its index."""
    for _ in range(1000):
        port = processes.free_port()
        if port % WORKERS == WORKER_INDEX:
            return port
    raise RuntimeError(f"no free port for xdist worker {WORKER} of {WORKERS}")


def redis_worker_url(url: str) -> str:
    """`url` moved to this worker's own Redis database: the one it names
    plus the worker's index (wrapping at 16). The workers' test databases
    hand out the same row ids, and the gateway keys its counters by them
    under one prefix: in one Redis database two workers' tenants would
    share counters."""
    parts = urlsplit(url)
    db = int(parts.path.strip("/") or 0)
    path = f"/{(db + WORKER_INDEX) % REDIS_DATABASES}"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def redis_per_worker() -> None:
    """Point this xdist worker, and every process it starts, at its own
    Redis database (redis_worker_url). Django's settings were read before
    any conftest is imported (pytest-django loads them first), so the
    settings that hold the URL are set again here."""
    url = os.environ.get("REDIS_URL")
    if not WORKER or not url:
        return
    from django.conf import settings

    from config.celery_app import app

    url = redis_worker_url(url)
    os.environ["REDIS_URL"] = url
    settings.REDIS_URL = settings.CELERY_BROKER_URL = url
    app.conf.broker_url = url


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
        return redis_worker_url(f"redis://127.0.0.1:6379/{REDIS_SCRATCH_DB}")
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


def embedded_up_env(tmp_path) -> dict[str, str]:
    """The environment of `manage.py up` as a new user runs it: no
    DATABASE_URL or REDIS_URL (the embedded PostgreSQL, a broker in a
    folder), everything it keeps under `tmp_path`."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    return env | {
        "EMBEDDED_POSTGRES_DIR": str(tmp_path / "pgdata"),
        "DEMO_KEYS_FILE": str(tmp_path / "keys.json"),
        "CELERY_BROKER_DIR": str(tmp_path / "broker"),
        "VAR_DIR": str(tmp_path / "var"),
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
    }
