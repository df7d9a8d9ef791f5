"""Bad input at start: a process started under production settings without a
required setting (or with it empty) exits at once with one line on stderr
naming it, and never half-starts. Each entry point the containers run is
started for real; each dies importing the settings, before it serves,
migrates, connects or forks anything."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = ("DJANGO_SECRET_KEY", "DATABASE_URL", "API_KEY_PEPPER")
GIVEN = {
    "DJANGO_SECRET_KEY": "s3cret-of-our-own",
    # Nothing listens on port 9: a process that got past its settings would
    # fail to connect, never touch a real database.
    "DATABASE_URL": "postgres://user:password@127.0.0.1:9/gpu_ledger",
    "API_KEY_PEPPER": "pepper-of-our-own",
}
# The containers' commands (docker-compose.yml, the Dockerfile's CMD).
ENTRY_POINTS = {
    "migrate": ["manage.py", "migrate", "--noinput"],
    "migrate_when_ready": ["manage.py", "migrate_when_ready", "--wait", "5"],
    "gateway": ["manage.py", "gateway", "--host", "127.0.0.1", "--port", "0", "--workers", "2"],
    "replica_register": [
        "manage.py",
        "replica_register",
        "r0",
        "http://127.0.0.1:9",
        "--model",
        "m",
    ],
    "web": ["-m", "uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", "0"],
    "worker": ["-m", "celery", "-A", "config", "worker", "--concurrency", "1", "-l", "INFO"],
    "beat": ["-m", "celery", "-A", "config", "beat", "-l", "INFO"],
}


def _start(argv: list[str], **settings: str) -> subprocess.CompletedProcess:
    environment = {
        name: value
        for name, value in os.environ.items()
        if name not in {*REQUIRED, "DJANGO_SETTINGS_MODULE"}
    }
    environment |= {"DJANGO_SETTINGS_MODULE": "config.settings.production", **settings}
    return subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,  # it should take about a second: a process that started hangs here
    )


def _assert_refused(started: subprocess.CompletedProcess, *names: str) -> None:
    assert "Traceback" not in started.stderr, started.stderr
    lines = started.stderr.splitlines()
    assert len(lines) == 1, started.stderr
    assert lines[0].startswith("configuration error: "), lines[0]
    for name in names:
        assert re.search(rf"\b{name} is required \(.+\)", lines[0]), lines[0]
    assert started.returncode == 3  # uvicorn's startup failure, see base.configuration_error
    assert started.stdout == ""


@pytest.mark.parametrize("missing", REQUIRED)
@pytest.mark.parametrize("entry_point", ENTRY_POINTS)
def test_an_empty_required_setting_stops_every_entry_point(entry_point, missing):
    # Empty rather than unset, which a developer's .env would fill in.
    started = _start(ENTRY_POINTS[entry_point], **{**GIVEN, missing: ""})
    _assert_refused(started, missing)
    assert [n for n in REQUIRED if n in started.stderr] == [missing]


@pytest.mark.parametrize("missing", REQUIRED)
def test_an_unset_required_setting_stops_the_process(missing):
    dotenv = ROOT / ".env"
    if dotenv.exists() and re.search(rf"(?m)^{missing}=", dotenv.read_text()):
        pytest.skip(f"this checkout's .env sets {missing}")
    given = {name: value for name, value in GIVEN.items() if name != missing}
    _assert_refused(_start(ENTRY_POINTS["migrate"], **given), missing)


def test_a_blank_value_is_missing():
    started = _start(ENTRY_POINTS["migrate"], **{**GIVEN, "API_KEY_PEPPER": "  "})
    _assert_refused(started, "API_KEY_PEPPER")


def test_every_missing_setting_is_named_in_the_one_line():
    started = _start(ENTRY_POINTS["migrate"], **dict.fromkeys(REQUIRED, ""))
    _assert_refused(started, *REQUIRED)


def test_a_database_url_that_is_not_postgresql_is_named():
    for url in ("mysql://user@host/db", "not-a-url"):
        started = _start(ENTRY_POINTS["migrate"], **{**GIVEN, "DATABASE_URL": url})
        assert "Traceback" not in started.stderr, started.stderr
        assert started.stderr.splitlines() == [
            "configuration error: DATABASE_URL must point at PostgreSQL "
            "(postgres://user:password@host:5432/db)"
        ]
        assert started.returncode == 3


def test_uvicorn_workers_stop_instead_of_restarting_forever():
    """`uvicorn --workers 2` (the web container) imports the app only in its
    workers: each says what is missing, and the supervisor stops on their
    startup-failure status instead of starting new ones that fail the same
    way. (Its own exit status is 0 and it logs its own lines: uvicorn's.)"""
    argv = [*ENTRY_POINTS["web"], "--workers", "2"]
    started = _start(argv, **{**GIVEN, "DATABASE_URL": ""})  # the timeout fails a loop
    assert "Traceback" not in started.stderr, started.stderr
    refusals = [line for line in started.stderr.splitlines() if "configuration error" in line]
    assert 1 <= len(refusals) <= 2 and all("DATABASE_URL is required" in r for r in refusals)
    assert "failed to start, stopping the parent process" in started.stderr
