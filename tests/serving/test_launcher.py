"""What the vLLM installer does with what a user can have on disk where
VLLM_VENV points: nothing, a half-made virtualenv, a dangling link, or a
folder that is not a virtualenv (a tracked link once broke fresh
clones)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serving.launcher import VenvUnusable, venv_prepare, vllm_install


def test_nothing_there_is_created(tmp_path):
    assert venv_prepare(tmp_path / "venv-vllm") == "creating"


def test_a_dangling_link_is_refused_naming_the_path_and_what_to_do(tmp_path):
    link = tmp_path / ".venv-vllm"
    link.symlink_to(tmp_path / "gone" / "venv-vllm")
    with pytest.raises(VenvUnusable) as refused:
        venv_prepare(link)
    message = str(refused.value)
    assert str(link) in message and "gone/venv-vllm" in message
    assert f"rm {link}" in message and "VLLM_VENV" in message


def test_a_folder_that_is_not_a_virtualenv_is_left_alone(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(VenvUnusable, match="not a virtualenv"):
        venv_prepare(tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_half_made_virtualenv_is_recreated(tmp_path, settings, monkeypatch):
    """An install interrupted after `venv` but before pip finished: the
    virtualenv is made anew (its python works again), then pip runs."""
    venv = tmp_path / "venv-vllm"
    venv.mkdir()
    (venv / "pyvenv.cfg").write_text("home = /nowhere\n")
    (venv / "bin").mkdir()
    (venv / "bin" / "python").write_text("broken")
    assert venv_prepare(venv) == "recreating half-made"

    settings.VLLM_VENV = venv
    settings.VAR_DIR = tmp_path / "var"
    pip_calls = []
    real_run = subprocess.run

    def run(argv, **kwargs):
        if argv[1:3] == ["-m", "pip"]:
            pip_calls.append(argv[3])
            return subprocess.CompletedProcess(argv, 0)
        return real_run(argv, **kwargs)

    monkeypatch.setattr("serving.launcher.subprocess.run", run)
    monkeypatch.setattr("serving.launcher.vllm_installed", lambda: True)
    notes = []
    vllm_install(progress=notes.append)
    assert notes[0] == f"recreating half-made virtualenv {venv}"
    assert pip_calls == ["install", "uninstall"]
    version = real_run(
        [str(venv / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert version.stdout.strip() == str(tuple(sys.version_info[:2]))
