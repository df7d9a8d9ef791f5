"""A real Celery worker process runs a real task whose result lands in the
database: on Redis (the machine's) and on the serverless folder broker."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.utils import timezone
from kombu import Connection

from tenants.models import ApiKey
from tenants.tasks import api_keys_mark_used_task
from tests.factories import make_key, make_tenant
from tests.services import database_url_for_subprocess, redis_url, require

ROOT = Path(__file__).resolve().parents[2]


def _broker(kind: str, tmp_path: Path) -> tuple[str, dict, dict]:
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


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["redis", "filesystem"])
def test_worker_runs_task_and_writes_the_database(kind, tmp_path):
    url, options, broker_env = _broker(kind, tmp_path)
    tenant = make_tenant()
    key, _ = make_key(tenant)
    other, _ = make_key(make_tenant())
    used_at = timezone.now().replace(microsecond=0)
    queue = f"test-{uuid.uuid4().hex[:8]}"

    env = {**os.environ, **broker_env}
    env |= {
        "DATABASE_URL": database_url_for_subprocess(),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
    }
    log = tmp_path / "worker.log"
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "config",
            "worker",
            "--pool=solo",
            "-Q",
            queue,
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=INFO",
        ],
        cwd=ROOT,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        with Connection(url, transport_options=options) as conn:
            api_keys_mark_used_task.apply_async(
                args=[{str(key.pk): used_at.isoformat()}], queue=queue, connection=conn
            )
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if ApiKey.objects.get(pk=key.pk).last_used_at is not None:
                break
            assert worker.poll() is None, log.read_text()
            time.sleep(0.3)
        assert ApiKey.objects.get(pk=key.pk).last_used_at == used_at, log.read_text()
        assert ApiKey.objects.get(pk=other.pk).last_used_at is None
        assert "tenants.api_keys_mark_used" in log.read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
