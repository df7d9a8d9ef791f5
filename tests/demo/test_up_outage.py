"""The main job rides out a database outage, caused for real: `manage.py up`
as a new user runs it (embedded PostgreSQL, no Redis), two tenants in two
currencies sending steady traffic through its gateway, and the embedded
database stopped for a minute (as `manage.py embedded_postgres stop` does)
and started again. Every service is still the one it started, the web app
answered 503 with Retry-After meanwhile, the logs say the outage in one
WARNING line per process and episode with no traceback, every answered
request is in the ledger to the token, and Ctrl-C then stops everything."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import psycopg
import pytest

from config.embedded_postgres import (
    embedded_postgres_start,
    embedded_postgres_status,
    embedded_postgres_stop,
)
from demo.stack import gateway_fleet_seen
from serving.tiny_model import MODEL_NAME
from tests.gateway.fake_upstream import FakeUpstream
from tests.services import embedded_up_env, free_port
from tests.traffic import Traffic

ROOT = Path(__file__).resolve().parents[2]
OUTAGE_SECONDS = 60
SERVICES = ("web", "gateway", "worker", "webhooks-worker", "beat")


def _wait_for(what: str, done, *, up: subprocess.Popen, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert up.poll() is None, f"up exited with {up.returncode}:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"{what} not within {timeout:.0f}s:\n{log.read_text()}"
        time.sleep(0.5)


def _children(pid: int) -> dict[str, int]:
    """The services `up` started, by name: web, gateway, the workers, beat."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(fields[1]) != pid:  # its parent
            continue
        name = next(
            (
                n
                for n, mark in (
                    ("web", "uvicorn"),
                    ("gateway", "manage.py gateway"),
                    ("webhooks-worker", "-Q webhooks"),
                    ("worker", " worker"),
                    ("beat", " beat"),
                )
                if mark in cmdline
            ),
            None,
        )
        if name:
            found[name] = int(stat.parent.name)
    return found


def _ledger(data_dir: Path, request_ids) -> dict[str, tuple[int, int]]:
    socket_dir, port = embedded_postgres_start(data_dir=data_dir)
    with psycopg.connect(
        host=str(socket_dir), port=port, user="postgres", dbname="gpu_ledger"
    ) as conn:
        rows = conn.execute(
            "SELECT request_id, prompt_tokens, completion_tokens FROM metering_usageevent "
            "WHERE request_id = ANY(%s)",
            [list(request_ids)],
        ).fetchall()
    return {rid: (prompt, completion) for rid, prompt, completion in rows}


@pytest.mark.slow
@pytest.mark.environment
def test_up_rides_out_its_database_stopped_for_a_minute_under_traffic(tmp_path):
    env = embedded_up_env(tmp_path)
    for folder in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
        # pg_ctl runs as the server's own user when we are root: it must reach the data.
        folder.chmod(folder.stat().st_mode | 0o011)
    data_dir = Path(env["EMBEDDED_POSTGRES_DIR"])
    web_port, gateway_port, operator_port = free_port(), free_port(), free_port()
    base_url, gateway_url = f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{gateway_port}"
    operator_url = f"http://127.0.0.1:{operator_port}"
    argv = [sys.executable, "manage.py", "up", "--no-vllm", "--history-months", "0"]
    argv += ["--port", str(web_port), "--gateway-port", str(gateway_port)]
    argv += ["--gateway-operator-port", str(operator_port)]
    log = tmp_path / "up.out"
    with log.open("w") as out:
        up = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    upstream = FakeUpstream().start()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        _wait_for("up", lambda: "GPU Ledger is up" in log.read_text(), up=up, log=log, timeout=400)
        services = _children(up.pid)
        assert set(services) == set(SERVICES), services
        register = [sys.executable, "manage.py", "replica_register", "outage-replica"]
        register += [upstream.base_url, "--model", MODEL_NAME, "--pool", "demo-shared"]
        subprocess.run(
            [*register, "--wait", "30"],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        gateway_fleet_seen(operator_url)
        keys = json.loads(Path(env["DEMO_KEYS_FILE"]).read_text())
        traffic = [Traffic(gateway_url, keys[slug], slug) for slug in ("hooli", "umbrella")]
        threads = [t.run(stop) for t in traffic]
        time.sleep(3)

        assert embedded_postgres_stop(data_dir=data_dir)
        stopped_at = time.monotonic()
        time.sleep(OUTAGE_SECONDS / 2)
        during = httpx.get(f"{base_url}/healthz", timeout=30)
        time.sleep(OUTAGE_SECONDS / 2)
        # Nobody started it again meanwhile: up's children wait for it.
        assert embedded_postgres_status(data_dir=data_dir) is None
        embedded_postgres_start(data_dir=data_dir)
        back_at = time.monotonic()
        _wait_for(
            "the web app back",
            lambda: httpx.get(f"{base_url}/healthz", timeout=30).status_code == 200,
            up=up,
            log=log,
            timeout=60,
        )
        time.sleep(5)
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        _wait_for(
            "the gateway's records written",
            lambda: all(
                w["record_backlog"] == 0 and w["spool"]["unwritten"] == 0
                for w in httpx.get(f"{operator_url}/healthz", timeout=5).json()["workers"]
            ),
            up=up,
            log=log,
            timeout=90,
        )

        # Every service is still the process up started: none exited.
        assert _children(up.pid) == services
        assert "started again" not in log.read_text()
        # The web app said 503, with when to try again, while the database was away.
        assert during.status_code == 503 and during.headers["Retry-After"] == "5"
        # The gateway served both tenants through the outage.
        for t in traffic:
            served = [at for at in t.answered_at if stopped_at + 5 < at < back_at]
            assert len(served) > 50, (t.label, len(served))
            # Umbrella's own rate limit (600 a minute) refuses some: nothing else.
            assert {code for code, _ in t.failed} <= {429} and not t.gone, t.failed[:3]
        # One WARNING line per process that noticed, no traceback anywhere.
        logs = {name: (tmp_path / "var" / "log" / f"{name}.log").read_text() for name in SERVICES}
        for name, text in logs.items():
            assert "Traceback" not in text, f"{name}.log:\n{text[-4000:]}"
        for name in ("gateway", "beat", "web"):
            said = [
                line
                for line in logs[name].splitlines()
                if " WARNING " in line and ("database" in line or "PostgreSQL" in line)
            ]
            assert len(said) == 1 and "the database is unavailable" in said[0], said[:5]
            assert "the database is available again" in logs[name], f"{name}:\n{logs[name]}"
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        if up.poll() is None:
            os.kill(up.pid, signal.SIGTERM)  # as Ctrl-C: up stops what it started
            up.wait(timeout=120)
        upstream.stop()

    # Everything answered is in the ledger, with its tokens, in both currencies' tenants.
    answered = {rid: tokens for t in traffic for rid, tokens in t.answered.items()}
    assert len(answered) > 200
    assert _ledger(data_dir, answered) == answered
    embedded_postgres_stop(data_dir=data_dir)
    # And Ctrl-C stopped every service it had started.
    assert up.returncode == 0, log.read_text()[-4000:]
    assert all(not Path(f"/proc/{pid}").exists() for pid in services.values())
