"""With DATABASE_URL unset the product runs on its embedded PostgreSQL: the
main job migrates, answers HTTP requests, and stops the server on exit."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from config.embedded_postgres import embedded_postgres_status
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_up_check_on_embedded_postgres(tmp_path):
    data_dir = tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {
        "EMBEDDED_POSTGRES_DIR": str(data_dir),
        "DEMO_KEYS_FILE": str(tmp_path / "keys.json"),
        "CELERY_BROKER_DIR": str(tmp_path / "broker"),
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
    }
    port = free_port()
    result = subprocess.run(
        [sys.executable, "manage.py", "up", "--check", "--port", str(port)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[2/4] migrations … ok" in result.stdout
    assert f"http://127.0.0.1:{port}/" in result.stdout
    assert "check passed" in result.stdout
    assert (data_dir / "PG_VERSION").exists()  # a real cluster was initialised there
    assert embedded_postgres_status(data_dir=data_dir) is None  # and stopped on exit
    secrets = (tmp_path / "keys.json").read_text()
    assert all(secret not in result.stdout for secret in secrets.split('"') if len(secret) > 40)
