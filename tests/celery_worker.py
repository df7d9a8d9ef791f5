"""A real Celery worker process for tests, on Redis (the machine's) or on
the serverless folder broker, and a publisher connected to the same."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from kombu import Connection

from tests.services import database_url_for_subprocess, redis_url, require

ROOT = Path(__file__).resolve().parents[1]


def broker(kind: str, tmp_path: Path) -> tuple[str, dict, dict]:
    """(broker URL, transport options, env for the worker)."""
    if kind == "redis":
        url = redis_url()
        require(url is not None, "no Redis on 127.0.0.1:6379 and REDIS_URL unset")
        return url, {}, {"REDIS_URL": url}
    folder = str(tmp_path / "broker")
    os.makedirs(folder, exist_ok=True)
    options = {
        "data_folder_in": folder,
        "data_folder_out": folder,
        "control_folder": os.path.join(folder, "control"),
        "store_processed": False,
    }
    return "filesystem://", options, {"REDIS_URL": "", "CELERY_BROKER_DIR": folder}


class Worker:
    """`celery worker --pool=solo` on its own queue; `send` publishes there."""

    def __init__(
        self, kind: str, tmp_path: Path, *, queues: tuple[str, ...] = (), env: dict | None = None
    ):
        self.url, self.options, broker_env = broker(kind, tmp_path)
        self.queue = f"test-{uuid.uuid4().hex[:8]}"
        # Also the default queue: for tasks the code queues by name (a
        # delivery's retries), on a folder broker of the test's own.
        self.queues = (self.queue, *queues)
        self.log = tmp_path / f"worker-{self.queue}.log"
        self.env = {
            **os.environ,
            **broker_env,
            "DATABASE_URL": database_url_for_subprocess(),
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            **(env or {}),
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> Worker:
        argv = [sys.executable, "-m", "celery", "-A", "config", "worker", "--pool=solo"]
        argv += ["-Q", ",".join(self.queues), "--without-gossip", "--without-mingle"]
        argv += ["--without-heartbeat"]
        self.process = subprocess.Popen(
            [*argv, "--loglevel=INFO"],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        return self

    def send(self, task, *args) -> None:
        with Connection(self.url, transport_options=self.options) as conn:
            task.apply_async(args=list(args), queue=self.queue, connection=conn)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.alive():
            self.process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=30)
        if self.alive():
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def broker_at(url: str, options: dict | None = None):
    """Point the Celery app (what tasks' .delay() and send_task publish
    to) at `url`, with a folder broker's `options` (Worker.options)."""
    from config.celery_app import app

    def reset():
        app._pool = None
        app.amqp._producer_pool = None

    before = app.conf.broker_url, app.conf.broker_transport_options
    app.conf.broker_url = url
    if options is not None:
        app.conf.broker_transport_options = options
    reset()
    try:
        yield
    finally:
        app.conf.broker_url, app.conf.broker_transport_options = before
        reset()


def worker_wait(predicate, worker: Worker | None = None, *, timeout: float = 120) -> None:
    """Until `predicate()`, failing with the worker's log if it dies or time runs out."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, worker.output() if worker else "timed out"
        if worker is not None:
            assert worker.alive(), worker.output()
        time.sleep(0.1)
