"""docker-compose.yml: every service the product needs, validated by a
Compose implementation (`docker compose config`, or docker-compose 1.29
installed into a cached virtualenv where the machine has no Compose
plugin: no Docker engine runs here, so nothing is started); the vLLM-CPU
image runs the same server flags as the local replicas."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from serving.launcher import GATEWAY_VLLM_FLAGS, replica_argv
from tests.services import require

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_VENV = Path(
    os.environ.get("COMPOSE_VENV", Path.home() / ".cache" / "gpu-ledger" / "venv-compose")
)
ENV = {
    **os.environ,
    "DJANGO_SECRET_KEY": "compose-config-check",
    "API_KEY_PEPPER": "compose-config-check",
}


def compose_cli() -> list[str] | None:
    """A Compose command line: Docker's plugin, a docker-compose on PATH,
    or docker-compose 1.29.2 installed into COMPOSE_VENV (about a minute,
    once; its PyYAML 5 needs Cython < 3 to build)."""
    if shutil.which("docker"):
        plugin = subprocess.run(["docker", "compose", "version"], capture_output=True)
        if plugin.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    binary = COMPOSE_VENV / "bin" / "docker-compose"
    if not binary.exists():
        pip = [str(COMPOSE_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        steps = [
            [sys.executable, "-m", "venv", str(COMPOSE_VENV)],
            [*pip, "cython<3", "wheel", "setuptools"],
            [*pip, "--no-build-isolation", "pyyaml==5.4.1"],
            [*pip, "docker-compose==1.29.2"],
        ]
        for step in steps:
            if subprocess.run(step, capture_output=True, timeout=900).returncode != 0:
                return None
    return [str(binary)]


@pytest.fixture(scope="module")
def compose():
    cli = compose_cli()
    require(cli is not None, "a Compose implementation (docker compose, or docker-compose)")
    return cli


PROFILES = ["--profile", "gpu", "--profile", "cpu", "--profile", "scale"]


def _config(compose, path: Path, *extra: str, env=ENV) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*compose, "-f", str(path), *PROFILES, "config", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_compose_validates_and_has_every_service(compose):
    result = _config(compose, ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    assert set(resolved) == {
        "postgres", "redis", "migrate", "web", "gateway", "worker", "webhooks", "beat",
        "vllm", "register-gpu", "vllm-cpu", "register-cpu",
        "nats-1", "nats-2", "nats-3", "usage-writer", "dask-scheduler", "dask-worker",
    }  # fmt: skip
    gpu = resolved["vllm"]["deploy"]["resources"]["reservations"]["devices"][0]
    assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["gpu"]
    assert resolved["vllm"]["image"].startswith("vllm/vllm-openai:")
    # Deliveries alone on workers of their own; the billing worker never takes them.
    assert resolved["webhooks"]["command"][3:6] == ["worker", "-Q", "webhooks"]
    assert "-Q" not in resolved["worker"]["command"]
    for name in ("web", "gateway", "worker", "webhooks", "beat", "register-cpu"):
        env = resolved[name]["environment"]
        assert env["DATABASE_URL"].endswith("@postgres:5432/gpu_ledger"), name
        assert env["REDIS_URL"] == "redis://redis:6379/0", name
    published = [p for s in resolved.values() for p in s.get("ports", [])]
    # Loopback only (v1 prints "127.0.0.1:8000:8000", v2 a mapping with host_ip).
    hosts = [p["host_ip"] if isinstance(p, dict) else p.split(":")[0] for p in published]
    assert hosts and set(hosts) == {"127.0.0.1"}


def test_the_scale_profile_runs_three_nats_nodes_writers_and_dask(compose):
    """Profile scale: three JetStream nodes routing to each other, two
    writers sharing a store volume with the Dask worker and the metering
    job's worker, the scaled path switched on by USAGE_LOG_URL alone."""
    env = {
        **ENV,
        "USAGE_LOG_URL": "nats://nats-1:4222,nats://nats-2:4222,nats://nats-3:4222",
        "USAGE_DASK_SCHEDULER": "tcp://dask-scheduler:8786",
    }
    result = _config(compose, ROOT / "docker-compose.yml", env=env)
    assert result.returncode == 0, result.stderr
    resolved = yaml.safe_load(result.stdout)["services"]
    for n in (1, 2, 3):
        command = resolved[f"nats-{n}"]["command"]
        assert "--jetstream" in command and command[command.index("--name") + 1] == f"nats-{n}"
        assert command[command.index("--routes") + 1].count("nats://") == 3
    writer = resolved["usage-writer"]
    assert writer["command"][2:] == ["usage_writer", "--alive-file", "/tmp/alive"]
    assert writer["deploy"]["replicas"] == 2
    for name in ("gateway", "worker", "web", "usage-writer", "dask-worker"):
        assert resolved[name]["environment"]["USAGE_LOG_URL"] == env["USAGE_LOG_URL"], name
    stores = {
        name
        for name, service in resolved.items()
        if any("/app/var/usage-store" in str(v) for v in service.get("volumes", []))
    }
    assert stores == {"usage-writer", "dask-worker", "worker", "web"}


def test_the_validator_rejects_a_broken_file(compose, tmp_path):
    broken = tmp_path / "docker-compose.yml"
    text = (ROOT / "docker-compose.yml").read_text()
    broken.write_text(text.replace("reservations:", "reservation:", 1))
    result = _config(compose, broken, "-q")
    assert result.returncode != 0 and "reservation" in (result.stderr + result.stdout)


def test_services_run_commands_that_exist():
    from django.core.management import get_commands

    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    commands = [s["command"] for s in services.values() if isinstance(s.get("command"), list)]
    managed = {c[2] for c in commands if c[:2] == ["python", "manage.py"]}
    assert managed == {"migrate_when_ready", "web", "gateway", "replica_register", "usage_writer"}
    assert managed <= set(get_commands())


def test_the_vllm_cpu_image_serves_with_the_local_replicas_flags():
    cmd = re.search(
        r"^CMD (\[.*\])$",
        (ROOT / "deploy" / "images" / "vllm-cpu" / "Dockerfile").read_text(),
        re.M,
    )
    image = json.loads(cmd.group(1))
    local = replica_argv(
        model_dir=Path("/models/tiny-llama"),
        served_model="tiny-llama",
        port=8000,
        max_num_seqs=64,
        max_model_len=2048,
    )
    assert image[:1] == ["python"] and local[1:3] == image[1:3] == [
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]

    def flags(argv):
        pairs, rest = {}, argv[3:]
        for i, arg in enumerate(rest):
            if arg.startswith("--"):
                nxt = rest[i + 1] if i + 1 < len(rest) else None
                pairs[arg] = nxt if nxt is not None and not nxt.startswith("--") else True
        return pairs

    assert flags(image) == {**flags(local), "--host": "0.0.0.0"}  # noqa: S104 (in a container)


@pytest.mark.parametrize("setting", ["DJANGO_SECRET_KEY", "API_KEY_PEPPER"])
def test_compose_refuses_to_start_without_a_secret(compose, setting):
    env = {k: v for k, v in ENV.items() if k != setting}
    result = _config(compose, ROOT / "docker-compose.yml", "-q", env=env)
    assert result.returncode != 0 and f"set {setting} in .env" in result.stderr


def _vllm_flags(argv: list[str]) -> list[str]:
    """The flags (and their values) the gateway relies on, as they appear."""
    wanted, out = {f for f in GATEWAY_VLLM_FLAGS if f.startswith("--")}, []
    for i, arg in enumerate(argv):
        if arg in wanted:
            out.append(arg)
            if arg == "--scheduling-policy":
                out.append(argv[i + 1])
    return out


def test_the_gpu_profile_sets_every_flag_the_gateway_relies_on():
    """Without `--scheduling-policy priority` vLLM serves a request's
    `priority` first come first served (with 200), without per-request
    metrics attribution has no timings, without prompt token details cached
    input is billed at the full price: the GPU service must say what the
    local replicas say."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    local = replica_argv(
        model_dir=Path("/m"), served_model="m", port=8000, max_num_seqs=8, max_model_len=512
    )
    assert _vllm_flags(local) == list(GATEWAY_VLLM_FLAGS)
    assert sorted(_vllm_flags(services["vllm"]["command"])) == sorted(GATEWAY_VLLM_FLAGS)
