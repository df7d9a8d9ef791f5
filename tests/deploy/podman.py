"""The project's images and containers, run for real with podman: built by
deploy/images/build (as docs/deployment.md says), on a bare
Debian base made with debootstrap where no registry can be reached."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTAINERS_CONF = ROOT / "deploy" / "podman" / "containers.conf"
# The tests' own tag, so a developer's `latest` images are left alone.
TAG = "test"


def podman_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF), **extra}


def podman_missing() -> str | None:
    """Why podman cannot run containers here, or None when it can."""
    for tool in ("podman", "runc", "debootstrap", "iptables"):
        if shutil.which(tool) is None:
            return (
                f"{tool} (Debian packages podman, runc, debootstrap, iptables; "
                "./dev test installs them)"
            )
    return None


def podman(
    *args: str, check: bool = True, timeout: float = 300, input: str | None = None
) -> subprocess.CompletedProcess:
    result = subprocess.run(
        ["podman", *args],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        input=input,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} ... exited {result.returncode}:\n{result.stderr[-3000:]}"
        )
    return result


@dataclass(frozen=True)
class Images:
    app: str
    vllm_cpu: str
    postgres: str
    redis: str
    nats: str


def images_build() -> Images:
    """Every image the stack runs, built from this checkout (podman's layer
    cache makes an unchanged rebuild take seconds)."""
    result = subprocess.run(
        [str(ROOT / "deploy" / "images" / "build"), "--engine", "podman", "--debian-base",
         "--with-services", "--tag", TAG],
        env=podman_env(),
        capture_output=True,
        text=True,
        timeout=2400,
    )  # fmt: skip
    if result.returncode != 0:
        raise AssertionError(f"deploy/images/build failed:\n{result.stdout}\n{result.stderr}")
    artifacts = ROOT / "test-artifacts"  # CI's: each image's build time, kept
    if artifacts.is_dir():
        (artifacts / "images-build.log").write_text(result.stdout)
    return Images(
        app=f"localhost/gpu-ledger:{TAG}",
        vllm_cpu=f"localhost/gpu-ledger-vllm-cpu:{TAG}",
        postgres=f"localhost/gpu-ledger-postgres:{TAG}",
        redis=f"localhost/gpu-ledger-redis:{TAG}",
        nats=f"localhost/gpu-ledger-nats:{TAG}",
    )
