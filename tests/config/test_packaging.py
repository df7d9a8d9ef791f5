"""`pip install .` (not the editable dev install) gives a worker every
task: each module a task imports is a runtime dependency, not a dev one
(httpx, imported by the replica scraper, was only in the dev extra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.celery_app import app

ROOT = Path(__file__).resolve().parents[2]
LIST_TASKS = (
    "import django; django.setup(); from config.celery_app import app; "
    "app.loader.import_default_modules(); "
    "print('\\n'.join(sorted(n for n in app.tasks if not n.startswith('celery.'))))"
)


@pytest.mark.slow
@pytest.mark.environment
def test_a_plain_install_imports_every_task(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", str(ROOT)],
        check=True,
        timeout=900,
        capture_output=True,
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.local"
    listed = subprocess.run(
        [str(python), "-c", LIST_TASKS],
        cwd=tmp_path,  # the installed packages, not the checkout's folders
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    app.loader.import_default_modules()
    expected = sorted(n for n in app.tasks if not n.startswith("celery."))
    assert listed.stdout.split() == expected
    assert "serving.replicas_scrape" in expected
