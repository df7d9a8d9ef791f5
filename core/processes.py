"""Child processes the main job starts (web server, later workers, the
gateway, vLLM replicas): their ports checked free first, started on
loopback, waited on until the process itself answers (not another one that
holds the port), and stopped by their own process id, never by name."""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

# The environment variable carrying a server's instance token; its readiness
# URL (the web app's /healthz, the gateway's operator /healthz) echoes it
# (settings.SERVER_INSTANCE) as "instance".
INSTANCE_ENV = "SERVER_INSTANCE"


class ProcessFailed(RuntimeError):
    """A child process could not be started or died: the message names it,
    says why and where its log is."""


class PortBusy(ProcessFailed):
    """A port the main job needs is held by another process."""


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
    # The ready URL answers JSON echoing the instance token this process was
    # given (our /healthz does): readiness then proves it is this process.
    ready_echoes_instance: bool = False
    instance: str = field(default_factory=lambda: secrets.token_hex(16))
    log_offset: int = 0  # where this run's lines begin in the (appended) log

    def start(self) -> None:
        if self.log_path:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.popen = subprocess.Popen(
            self.argv,
            env={**os.environ, INSTANCE_ENV: self.instance, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: a terminal's Ctrl-C is ours to relay
        )

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    @property
    def returncode(self) -> int | None:
        """None while it runs (or before it started), else its exit code."""
        return self.popen.poll() if self.popen else None

    def wait_ready(self, *, timeout: float) -> None:
        """Poll `ready_url` until it answers 2xx (with this process's
        instance token when `ready_echoes_instance`). Raise ProcessFailed at
        once if the process exits, or if another process answers instead."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.returncode is not None:
                raise ProcessFailed(self.exit_report(while_doing="while starting"))
            if self.ready_url is None:
                return
            if not self.ready_echoes_instance:
                if url_answers(self.ready_url):
                    return
            else:
                answer = ready_answer(self.ready_url)
                if answer is not None:
                    if answer.get("instance") == self.instance:
                        return
                    # Ours cannot have bound a port something else answers on.
                    raise ProcessFailed(
                        f"{self.name}: what answers {self.ready_url} is not the {self.name} "
                        f"just started (pid {self.pid}) but another process holding the "
                        f"port; see {self.log_path}"
                    )
            time.sleep(0.2)
        raise ProcessFailed(f"{self.name} not ready after {timeout:.0f}s; see {self.log_path}")

    def log_tail(self, *, lines: int = 15) -> list[str]:
        """The last lines this run wrote to its log (none without a log file)."""
        if self.log_path is None or not self.log_path.exists():
            return []
        with self.log_path.open("rb") as log:
            end = log.seek(0, os.SEEK_END)
            log.seek(max(self.log_offset, end - 64 * 1024))  # a long run's log can be large
            text = log.read().decode(errors="replace")
        return list(deque(text.splitlines(), maxlen=lines))

    def exit_report(self, *, while_doing: str = "", lines: int = 15) -> str:
        """Which process exited, its code, its log file and the log's last lines."""
        when = f" {while_doing}" if while_doing else ""
        head = (
            f"{self.name} (pid {self.pid}) exited{when} with code {self.returncode}; "
            f"log {self.log_path}"
        )
        tail = self.log_tail(lines=lines)
        if not tail:
            return head
        return head + "; the end of its log:\n" + "\n".join(f"    {t}" for t in tail)

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


def ready_answer(url: str, *, timeout: float = 2.0) -> dict | None:
    """The JSON object a readiness URL answers with 2xx; {} when a 2xx
    answer is not a JSON object; None when nothing answers 2xx."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 (loopback)
            if not 200 <= response.status < 300:
                return None
            body = response.read(65536)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return None
    try:
        answer = json.loads(body)
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def port_is_free(*, host: str, port: int) -> bool:
    """Whether a server could listen on host:port now (a bind test, with
    SO_REUSEADDR as servers set it, so a port in TIME_WAIT counts as free)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def ports_check_free(*, ports: list[tuple[str, int, str]]) -> None:
    """Each (host, port, option) free, else PortBusy naming every busy port
    and the option that moves it."""
    busy = [
        (host, port, option)
        for host, port, option in ports
        if not port_is_free(host=host, port=port)
    ]
    if busy:
        raise PortBusy(
            "; ".join(
                f"port {port} on {host} is already in use by another process: stop that "
                f"process or choose another port with {option}"
                for host, port, option in busy
            )
        )


def free_port() -> int:
    """A TCP port free on loopback now, below the kernel's ephemeral range.

    A server is often started a while after its port is chosen (a gateway
    after vLLM's minute of start-up); a port the kernel hands out itself
    (bind to 0) comes from the ephemeral range, where any outgoing
    connection meanwhile may take it. Below that range only a listener
    takes a port, so one found free now stays free."""
    import random
    import socket

    low = _ephemeral_low()
    for _ in range(200):
        port = random.randint(max(1024, low - 12000), low - 1)  # noqa: S311 (not a secret)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # all taken: whatever the kernel gives
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


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


# A child that exits is started again after this wait, doubling while it
# keeps exiting soon after each start, up to the cap; one that ran for
# RESTART_STEADY_SECONDS before exiting starts again after the first wait.
RESTART_FIRST_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0
RESTART_STEADY_SECONDS = 60.0


@dataclass
class _Watch:
    started_at: float
    quick_exits: int = 0
    restart_at: float | None = None  # monotonic; set while it waits to start again


class Supervisor:
    """Keeps the main job's children running: a child that exits is named
    (its exit report: code, log and last lines) and started again, with
    backoff while it keeps exiting; the stack is not stopped for it. One
    `poll` does one round; the caller loops."""

    def __init__(self, processes: list[ManagedProcess], *, say) -> None:
        self.processes = processes
        self.say = say  # one message per exit and per restart
        now = time.monotonic()
        self._watch = {id(p): _Watch(started_at=now) for p in processes}
        self.restarts = 0

    def poll(self) -> None:
        now = time.monotonic()
        for process in self.processes:
            watch = self._watch.setdefault(id(process), _Watch(started_at=now))
            if watch.restart_at is None:
                if process.returncode is None:
                    continue
                ran = now - watch.started_at
                watch.quick_exits = 0 if ran >= RESTART_STEADY_SECONDS else watch.quick_exits + 1
                wait = min(
                    RESTART_MAX_SECONDS, RESTART_FIRST_SECONDS * 2 ** max(0, watch.quick_exits - 1)
                )
                watch.restart_at = now + wait
                self.say(f"{process.exit_report(lines=5)}\nstarting it again in {wait:g} s")
            elif now >= watch.restart_at:
                process.start()
                watch.started_at, watch.restart_at = now, None
                self.restarts += 1
                self.say(f"{process.name} started again (pid {process.pid})")


def processes_stop(processes: list[ManagedProcess], *, say) -> None:
    """Stop every process, last started first, whatever stopping one of
    them raises (said, then the next one stopped)."""
    for process in reversed(processes):
        try:
            process.stop()
        except Exception as exc:  # one that will not stop must not keep the rest running
            say(f"could not stop {process.name} (pid {process.pid}): {exc}")
