"""The main job fails loudly: a port already taken stops `up` before
anything starts, naming the port and the option that moves it; readiness
counts only the process just started, never another one answering on its
port; a child that exits is named with its exit code, log file and last
lines; a workload in which no request succeeded fails its step."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from core import processes as processes_module
from core.processes import (
    ManagedProcess,
    ProcessFailed,
    database_url_for_subprocess,
    uvicorn_argv,
)
from demo.stack import WorkloadFailed, workload
from tests.gateway.fake_upstream import FakeUpstream
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]


@contextmanager
def listener():
    """Another process's server: a socket listening on a loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


@contextmanager
def foreign_server(status: int, body: dict):
    """A tiny HTTP server answering `status` and `body` to every request."""

    class Answer(BaseHTTPRequestHandler):
        def _answer(self):
            length = int(self.headers.get("content-length") or 0)
            self.rfile.read(length)
            payload = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def no_child_starts(monkeypatch):
    """Fails the test if the command starts any child process."""
    started = []
    monkeypatch.setattr(processes_module.subprocess, "Popen", lambda *a, **k: started.append(a))
    yield
    assert started == []


# --- ports ---------------------------------------------------------------


def test_a_busy_web_port_stops_up_naming_the_port_and_option(no_child_starts):
    # No database access is allowed in this test: `up` must stop before it.
    with listener() as busy, pytest.raises(CommandError) as stopped:
        call_command(
            "up", "--check", "--no-vllm", "--port", str(busy), "--gateway-port", str(free_port())
        )
    message = str(stopped.value)
    assert f"port {busy} on 127.0.0.1 is already in use" in message
    assert "--port" in message and "--gateway-port" not in message


def test_a_busy_gateway_port_names_gateway_port(no_child_starts):
    with listener() as busy, pytest.raises(CommandError) as stopped:
        call_command(
            "up", "--check", "--no-vllm", "--port", str(free_port()), "--gateway-port", str(busy)
        )
    assert f"port {busy} on 127.0.0.1 is already in use" in str(stopped.value)
    assert "with --gateway-port" in str(stopped.value)


def test_both_busy_ports_are_named_at_once(no_child_starts):
    with listener() as web, listener() as gateway, pytest.raises(CommandError) as stopped:
        call_command("up", "--no-vllm", "--port", str(web), "--gateway-port", str(gateway))
    message = str(stopped.value)
    assert f"port {web} " in message and f"port {gateway} " in message
    assert "with --port" in message and "with --gateway-port" in message


def test_the_same_port_twice_is_refused(no_child_starts):
    port = free_port()
    with pytest.raises(CommandError, match="--port and --gateway-port are both"):
        call_command("up", "--no-vllm", "--port", str(port), "--gateway-port", str(port))
    with pytest.raises(CommandError, match="--gateway-port and --gateway-operator-port are both"):
        call_command(
            "up", "--no-vllm", "--port", str(free_port()),
            "--gateway-port", str(port), "--gateway-operator-port", str(port),
        )  # fmt: skip


def test_a_busy_gateway_operator_port_names_its_option(no_child_starts):
    with listener() as busy, pytest.raises(CommandError) as stopped:
        call_command(
            "up", "--check", "--no-vllm", "--port", str(free_port()),
            "--gateway-port", str(free_port()), "--gateway-operator-port", str(busy),
        )  # fmt: skip
    assert f"port {busy} on 127.0.0.1 is already in use" in str(stopped.value)
    assert "with --gateway-operator-port" in str(stopped.value)


def test_up_exits_non_zero_and_starts_nothing(tmp_path):
    """As a user runs it: exit code 1, the message on stderr, and not even
    the embedded database initialised."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {
        "EMBEDDED_POSTGRES_DIR": str(tmp_path / "pgdata"),
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
    }
    with listener() as busy:
        result = subprocess.run(
            [sys.executable, "manage.py", "up", "--no-vllm", "--port", str(busy)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"port {busy} on 127.0.0.1 is already in use" in result.stderr
    assert "--port" in result.stderr
    assert "[1/9]" not in result.stdout  # no step began
    assert not (tmp_path / "pgdata").exists()


# --- readiness -----------------------------------------------------------


def _sleeper(tmp_path, name="web", **kwargs) -> ManagedProcess:
    return ManagedProcess(
        name=name,
        argv=[sys.executable, "-c", "import time; time.sleep(60)"],
        log_path=tmp_path / f"{name}.log",
        **kwargs,
    )


def test_readiness_refuses_another_process_answering_on_the_port(tmp_path):
    """The port was free at the check; then another server took it before
    ours could: its 200 must not count as ours being ready."""
    with foreign_server(200, {"status": "ok"}) as url:
        web = _sleeper(tmp_path, ready_url=f"{url}/healthz", ready_echoes_instance=True)
        web.start()
        try:
            with pytest.raises(ProcessFailed) as refused:
                web.wait_ready(timeout=10)
        finally:
            web.stop()
    message = str(refused.value)
    assert "is not the web just started" in message and str(tmp_path / "web.log") in message


def test_readiness_refuses_another_instance_token(tmp_path):
    """Even one of our own servers, left over from an earlier run, is not
    the process just started."""
    with foreign_server(200, {"status": "ok", "instance": "an-earlier-run"}) as url:
        web = _sleeper(tmp_path, ready_url=f"{url}/healthz", ready_echoes_instance=True)
        web.start()
        try:
            with pytest.raises(ProcessFailed, match="not the web just started"):
                web.wait_ready(timeout=10)
        finally:
            web.stop()


def test_a_child_exiting_while_starting_fails_at_once_naming_it_and_its_log(tmp_path):
    crash = "print('OSError: [Errno 98] address already in use'); raise SystemExit(3)"
    gateway = ManagedProcess(
        name="gateway",
        argv=[sys.executable, "-c", crash],
        log_path=tmp_path / "gateway.log",
        ready_url=f"http://127.0.0.1:{free_port()}/healthz",
        ready_echoes_instance=True,
    )
    gateway.start()
    with pytest.raises(ProcessFailed) as failed:
        gateway.wait_ready(timeout=60)
    message = str(failed.value)
    assert f"gateway (pid {gateway.pid}) exited while starting with code 3" in message
    assert str(tmp_path / "gateway.log") in message
    assert "address already in use" in message  # the log's last lines


def test_a_child_that_died_later_is_named_with_code_log_and_last_lines(tmp_path):
    lines = "; ".join(f"print('line {n}')" for n in range(30))
    (tmp_path / "worker.log").write_text("a line from an earlier run\n")
    worker = ManagedProcess(
        name="worker",
        argv=[sys.executable, "-c", f"{lines}; raise SystemExit(2)"],
        log_path=tmp_path / "worker.log",
    )
    worker.start()
    worker.popen.wait(timeout=30)
    report = worker.exit_report()
    assert report.startswith(f"worker (pid {worker.pid}) exited with code 2; log ")
    assert str(tmp_path / "worker.log") in report
    assert "line 29" in report and "line 15" in report and "line 14" not in report
    assert "earlier run" not in report


def test_only_this_runs_lines_are_quoted(tmp_path):
    (tmp_path / "beat.log").write_text("an error from yesterday's run\n")
    beat = ManagedProcess(
        name="beat",
        argv=[sys.executable, "-c", "raise SystemExit(1)"],
        log_path=tmp_path / "beat.log",
    )
    beat.start()
    beat.popen.wait(timeout=30)
    assert beat.exit_report() == (
        f"beat (pid {beat.pid}) exited with code 1; log {tmp_path / 'beat.log'}"
    )


@pytest.mark.slow
@pytest.mark.django_db
def test_the_web_server_and_gateway_answer_readiness_with_their_own_token(tmp_path):
    """What `up` starts: each server's /healthz echoes the token it was given."""
    env = {
        "DATABASE_URL": database_url_for_subprocess(),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "REDIS_URL": "",
    }
    web_port, gateway_port, operator_port = free_port(), free_port(), free_port()
    started = [
        ManagedProcess(
            name="web",
            argv=uvicorn_argv("config.asgi:application", host="127.0.0.1", port=web_port),
            env=env,
            log_path=tmp_path / "web.log",
            ready_url=f"http://127.0.0.1:{web_port}/healthz",
            ready_echoes_instance=True,
        ),
        ManagedProcess(
            name="gateway",
            argv=[
                *[sys.executable, "manage.py", "gateway", "--port", str(gateway_port)],
                *["--operator-port", str(operator_port)],
            ],
            env=env,
            log_path=tmp_path / "gateway.log",
            # The operator port's detailed health echoes it; the tenants' says nothing more.
            ready_url=f"http://127.0.0.1:{operator_port}/healthz",
            ready_echoes_instance=True,
        ),
    ]
    try:
        for process in started:
            process.start()
        for process in started:
            process.wait_ready(timeout=60)  # raises unless its own token came back
    finally:
        for process in started:
            process.stop()


def test_healthz_echoes_the_instance_token_only_when_given(client, settings, db):
    assert "instance" not in client.get("/healthz").json()
    settings.SERVER_INSTANCE = "f00d"
    assert client.get("/healthz").json()["instance"] == "f00d"


# --- the workload --------------------------------------------------------


@pytest.fixture
def demo_keys(settings, tmp_path):
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"hooli": "glk_hooli", "acme": "glk_acme"}))
    settings.DEMO_KEYS_FILE = path
    settings.GATEWAY = {**settings.GATEWAY, "FLEET_REFRESH_SECONDS": 0}
    return path


def test_a_workload_with_every_request_refused_fails(demo_keys):
    """Another process on the gateway's port refusing every request."""
    refusal = {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}
    with foreign_server(401, refusal) as url, pytest.raises(WorkloadFailed) as failed:
        workload(gateway_url=url, operator_url=url, seconds=0.5)
    message = str(failed.value)
    refused = int(message.split(" refused")[0].split()[-1])
    assert refused > 0 and " 0 failed" in message
    assert "first error:" in message and "Incorrect API key provided" in message


def test_a_workload_with_nothing_listening_fails(demo_keys):
    with pytest.raises(WorkloadFailed) as failed:
        nowhere = f"http://127.0.0.1:{free_port()}"
        workload(gateway_url=nowhere, operator_url=nowhere, seconds=0.5)
    assert "0 refused" in str(failed.value) and "APIConnectionError" in str(failed.value)


def test_a_workload_with_answers_passes_and_counts_them(demo_keys):
    upstream = FakeUpstream().start()
    try:
        result = workload(
            gateway_url=upstream.base_url, operator_url=upstream.base_url, seconds=0.5
        )
    finally:
        upstream.stop()
    assert set(result.per_tenant) == {"hooli", "acme"}
    assert all(counts["ok"] > 0 for counts in result.per_tenant.values())
    assert result.total("refused") == result.total("failed") == 0
