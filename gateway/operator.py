"""The gateway's operator listener: GET /metrics (Prometheus) and GET
/healthz (each worker's detail: fleet, queue, record backlog, event loop),
on a port of its own (GATEWAY_OPERATOR_HOST / GATEWAY_OPERATOR_PORT,
loopback by default), as Envoy keeps its admin interface apart from its
traffic listeners. Both name tenants or replicas (requests and tokens per
tenant; a dedicated replica's name says who has one), so neither answers on
the port tenants call, whose /healthz says only that the process is alive.

It runs on threads of `manage.py gateway`'s own process: with one worker
that process is the worker; with several, uvicorn's supervisor, which
serves no tenant and outlives any one worker. It asks each worker over
its channel (gateway.operator_channel) for its health, and to set the
gauges read at scrape time (backlog, queue) before a scrape.

Several workers, one scrape: prometheus_client's multiprocess mode. Each
worker writes its counters, histograms and gauges to memory-mapped files
in a private directory (PROMETHEUS_MULTIPROC_DIR, made empty for each run
as the library requires), and a scrape sums them over the workers: a
tenant's requests are one series, whichever worker served them, and a
worker that uvicorn replaces keeps its counts (its files stay). A port per
worker was the other way: the operator's Prometheus would need one target
per worker (changing with --workers, or a worker restarted), every query a
sum over them, and the workers, which uvicorn does not number, would have
to race for ports. One worker (the benchmarks' gateway) keeps in-memory
metrics: the mode's file writes buy nothing there."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import orjson
from django.conf import settings

from gateway.errors import error_body
from gateway.operator_channel import CHANNEL_DIR_ENV, WorkerGone, worker_ask, worker_sockets

logger = logging.getLogger("gateway")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # read by prometheus_client when it is imported
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


def operator_port_parse(value: str | int) -> int:
    """A TCP port from a setting or an option; ValueError unless 1-65535
    (0 would be a port the kernel picks, which no Prometheus could find)."""
    try:
        port = int(str(value).strip())
    except ValueError:
        raise ValueError(f"must be a TCP port from 1 to 65535, not {str(value)!r}") from None
    if not 1 <= port <= 65535:
        raise ValueError(f"must be a TCP port from 1 to 65535, not {port}")
    return port


@dataclass
class OperatorRun:
    """Where one run of a gateway's workers and its operator listener meet:
    a private temporary directory (0700) with the workers' channel sockets
    and, with several workers, their metrics files. Named to the workers
    through the environment, which uvicorn's workers inherit."""

    directory: Path
    workers: int

    @property
    def channels(self) -> Path:
        return self.directory / "workers"

    @property
    def metrics_dir(self) -> Path | None:
        return self.directory / "metrics" if self.workers > 1 else None

    @classmethod
    def create(cls, *, workers: int) -> OperatorRun:
        run = cls(Path(tempfile.mkdtemp(prefix="gateway-operator-")), workers)
        run.channels.mkdir()
        os.environ[CHANNEL_DIR_ENV] = str(run.channels)
        if run.metrics_dir is not None:
            run.metrics_dir.mkdir()
            os.environ[MULTIPROC_ENV] = str(run.metrics_dir)
        else:  # one worker: its metrics in memory, whatever the environment said
            os.environ.pop(MULTIPROC_ENV, None)
        return run

    def close(self) -> None:
        for name in (CHANNEL_DIR_ENV, MULTIPROC_ENV):
            if os.environ.get(name, "").startswith(str(self.directory)):
                del os.environ[name]
        shutil.rmtree(self.directory, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _gone_workers_forget(run: OperatorRun) -> None:
    """A worker that died (and was replaced): its socket removed, and its
    live gauges dropped from the sums (its counters stay: what it counted
    happened)."""
    pids = set(worker_sockets(run.channels))
    if run.metrics_dir is not None:
        for path in run.metrics_dir.glob("gauge_live*_*.db"):
            with contextlib.suppress(ValueError):
                pids.add(int(path.stem.rsplit("_", 1)[1]))
    for pid in pids:
        if _alive(pid):
            continue
        with contextlib.suppress(FileNotFoundError):
            (run.channels / f"{pid}.sock").unlink()
        if run.metrics_dir is not None:
            from prometheus_client.multiprocess import mark_process_dead

            mark_process_dead(pid, str(run.metrics_dir))


def metrics_exposition(run: OperatorRun) -> bytes:
    """Every worker's metrics, as one Prometheus exposition."""
    for path in worker_sockets(run.channels).values():
        with contextlib.suppress(WorkerGone):  # a stalled worker: its gauges as last set
            worker_ask(path, "gauges")
    if run.metrics_dir is None:
        # This process is the worker: its registry, read here (the loop's
        # thread never renders a scrape of every tenant's series).
        from gateway.telemetry import exposition

        return exposition()
    # Imported here, not at the top: prometheus_client picks its mode when
    # first imported, and in a one-worker gateway that is the app's import,
    # after OperatorRun.create has set the environment.
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    _gone_workers_forget(run)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(run.metrics_dir))
    return generate_latest(registry)


def health_detail(run: OperatorRun) -> tuple[int, dict]:
    """Each worker's health, in a section of its own (its fleet, queue and
    record backlog are its own); 200 when every worker answers, else 503
    (starting, or one stalled or replaced), which a readiness probe wants."""
    sections = []
    for pid, path in worker_sockets(run.channels).items():
        try:
            sections.append({"pid": pid, **worker_ask(path, "health")})
        except WorkerGone as gone:
            if _alive(pid):
                sections.append({"pid": pid, "status": "not answering", "error": str(gone)})
    _gone_workers_forget(run)
    answering = sum(1 for s in sections if "error" not in s)
    ready = answering >= run.workers
    answer = {
        "status": "ok" if ready else "unavailable",
        "workers_expected": run.workers,
        "workers_answering": answering,
        "workers": sections,
        # Whoever started this process can tell it from another on the port.
        **({"instance": settings.SERVER_INSTANCE} if settings.SERVER_INSTANCE else {}),
    }
    return (200 if ready else 503), answer


class _Handler(BaseHTTPRequestHandler):
    server: OperatorServer
    protocol_version = "HTTP/1.1"  # keep-alive for a scraper

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        try:
            if path == "/metrics":
                self._answer(200, metrics_exposition(self.server.operator_run), PROMETHEUS)
            elif path == "/healthz":
                status, answer = health_detail(self.server.operator_run)
                self._answer(status, orjson.dumps(answer))
            else:
                self._answer(404, error_body(404, f"no route for GET {path}"))
        except Exception:
            logger.exception("operator listener: %s failed", path)
            self._answer(500, error_body(500, f"{path} failed; see the gateway's log"))

    def do_POST(self) -> None:
        self._answer(405, error_body(405, "the operator listener answers GET only"))

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:
        pass  # a scrape every 15 s is not news


class OperatorServer(ThreadingHTTPServer):
    """The operator listener, bound at construction (a busy port fails
    before any worker starts) and served on a daemon thread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], *, run: OperatorRun) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.operator_run = run
        super().__init__(address, _Handler)
        self._thread = threading.Thread(
            target=self.serve_forever, name="operator-listener", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self.shutdown()
        self.server_close()
