"""Child processes the main job starts (web server, later workers, the
gateway, vLLM replicas): started on loopback, waited on until ready, and
stopped by their own process id, never by name."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path


def uvicorn_argv(app: str, *, host: str, port: int, workers: int = 1) -> list[str]:
    """The command line of a uvicorn server for `app` on loopback."""
    import sys

    return [
        sys.executable,
        "-m",
        "uvicorn",
        app,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--no-access-log",
        "--log-level",
        "warning",
    ]


@dataclass
class ManagedProcess:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    ready_url: str | None = None
    popen: subprocess.Popen | None = None

    def start(self) -> None:
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.popen = subprocess.Popen(
            self.argv,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a terminal's Ctrl-C is ours to relay
        )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def wait_ready(self, *, timeout: float) -> None:
        """Poll `ready_url` until it answers 2xx; raise if the process died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen is not None and self.popen.poll() is not None:
                raise RuntimeError(
                    f"{self.name} exited with code {self.popen.returncode}; see {self.log_path}"
                )
            if self.ready_url is None or url_answers(self.ready_url):
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def stop(self, *, timeout: float = 15) -> None:
        """SIGTERM to its process group (a graceful stop), SIGKILL if it lingers."""
        if self.popen is None or self.popen.poll() is not None:
            return
        try:
            os.killpg(self.popen.pid, signal.SIGTERM)
            self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=5)
        except ProcessLookupError:
            return


def url_answers(url: str, *, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
            return 200 <= response.status < 300
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return False


def free_port() -> int:
    """A TCP port free on loopback right now."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_url_for_subprocess(*, name: str | None = None) -> str:
    """A DATABASE_URL naming the database this process is using (or `name`
    on the same server), so a worker or server we start sees the same rows."""
    from urllib.parse import quote

    from django.db import connection

    s = connection.settings_dict
    connection.ensure_connection()  # the embedded backend fills HOST/PORT on connect
    user = quote(s["USER"], safe="")
    password = f":{quote(s['PASSWORD'], safe='')}" if s.get("PASSWORD") else ""
    host = str(s["HOST"])
    if host.startswith("/"):  # a Unix socket directory travels in the path (django-environ)
        return f"postgres://{user}{password}@/{quote(host, safe='')}/{name or s['NAME']}"
    return f"postgres://{user}{password}@{host}:{s['PORT']}/{name or s['NAME']}"
