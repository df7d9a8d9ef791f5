"""Once up, the main job keeps its children running: one that exits is
named (code, log, last lines) and started again, with backoff while it
keeps exiting, and the others are left serving; on the way out every child
is stopped, whatever stopping one of them raises."""

from __future__ import annotations

import sys
import time

import pytest

from core import processes
from core.processes import ManagedProcess, Supervisor, processes_stop

SLEEP = "import time; time.sleep(60)"


def _child(tmp_path, name: str, code: str) -> ManagedProcess:
    child = ManagedProcess(
        name=name, argv=[sys.executable, "-c", code], log_path=tmp_path / f"{name}.log"
    )
    child.start()
    return child


def _poll_until(supervisor: Supervisor, done, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the supervisor never got there"
        supervisor.poll()
        time.sleep(0.05)


def test_a_child_that_exits_is_named_and_started_again_the_others_untouched(tmp_path):
    marker = tmp_path / "crashed-once"
    crash_once = (
        f"import pathlib, sys, time\np = pathlib.Path({str(marker)!r})\n"
        "if not p.exists():\n    p.write_text('x'); print('beat: OperationalError', flush=True)"
        "; sys.exit(1)\ntime.sleep(60)"
    )
    web = _child(tmp_path, "web", SLEEP)
    beat = _child(tmp_path, "beat", crash_once)
    first = beat.pid
    said: list[str] = []
    supervisor = Supervisor([web, beat], say=said.append)
    try:
        _poll_until(supervisor, lambda: supervisor.restarts == 1)
        assert said[0].startswith(f"beat (pid {first}) exited with code 1; log {beat.log_path}")
        assert "beat: OperationalError" in said[0]  # the log's last lines
        assert said[0].endswith("starting it again in 1 s")
        assert said[1] == f"beat started again (pid {beat.pid})"
        assert beat.pid != first and beat.returncode is None and web.returncode is None
        for _ in range(10):  # and it stays up: nothing more to say
            supervisor.poll()
        assert len(said) == 2
    finally:
        processes_stop([web, beat], say=said.append)
    assert web.returncode is not None and beat.returncode is not None


def test_a_child_that_keeps_exiting_waits_longer_each_time(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "RESTART_FIRST_SECONDS", 0.1)
    worker = _child(tmp_path, "worker", "raise SystemExit(2)")
    said: list[str] = []
    supervisor = Supervisor([worker], say=said.append)
    try:
        _poll_until(supervisor, lambda: supervisor.restarts == 3)
    finally:
        processes_stop([worker], say=said.append)
    waits = [line.rsplit("again in ", 1)[1] for line in said if "again in" in line]
    assert waits[:3] == ["0.1 s", "0.2 s", "0.4 s"]


def test_stopping_goes_on_past_a_child_that_will_not_stop(tmp_path, monkeypatch):
    web, gateway, worker = (_child(tmp_path, n, SLEEP) for n in ("web", "gateway", "worker"))

    def refuses(**kwargs):
        raise PermissionError("not yours")

    monkeypatch.setattr(gateway, "stop", refuses)
    said: list[str] = []
    processes_stop([web, gateway, worker], say=said.append)
    assert said == [f"could not stop gateway (pid {gateway.pid}): not yours"]
    assert web.returncode is not None and worker.returncode is not None
    monkeypatch.undo()
    gateway.stop()


@pytest.mark.parametrize("code", [0, 3])
def test_a_child_exiting_cleanly_or_not_is_restarted_alike(tmp_path, code):
    """Whatever its code: a service of the stack that is gone is started again."""
    marker = tmp_path / "once"
    once = (
        f"import pathlib, sys, time\np = pathlib.Path({str(marker)!r})\n"
        f"if not p.exists():\n    p.write_text('x'); sys.exit({code})\ntime.sleep(60)"
    )
    gateway = _child(tmp_path, "gateway", once)
    said: list[str] = []
    supervisor = Supervisor([gateway], say=said.append)
    try:
        _poll_until(supervisor, lambda: supervisor.restarts == 1)
        assert f"exited with code {code}" in said[0]
    finally:
        processes_stop([gateway], say=said.append)
