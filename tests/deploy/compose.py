"""docker-compose.yml run for real under podman-compose, from the images
built from this checkout: a project of its own, ports of its own, and
`manage.py shell` inside its containers to set up and to read what the
product wrote."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from tests.deploy.podman import ROOT, Images, podman, podman_env
from tests.services import free_port

ARTIFACTS = ROOT / "test-artifacts"


def podman_compose() -> str | None:
    beside = Path(sys.executable).parent / "podman-compose"
    return str(beside) if beside.exists() else shutil.which("podman-compose")


@dataclass
class Stack:
    project: str
    env: dict[str, str]
    web_port: int
    gateway_port: int
    operator_port: int
    keys: dict[str, str] = field(default_factory=dict)
    profile: str = "cpu"

    # --- compose ---------------------------------------------------------
    def compose(self, *args: str, timeout: float = 600, check: bool = True):
        result = subprocess.run(
            [podman_compose(), "-p", self.project, "-f", str(ROOT / "docker-compose.yml"),
             "--profile", self.profile, *args],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(f"podman-compose {' '.join(args)}:\n{result.stderr[-4000:]}")
        return result

    def container(self, service: str) -> str:
        return f"{self.project}_{service}_1"

    def revived(self, service: str) -> None:
        """After a kill: the container running again. Its `restart:
        unless-stopped` does not bring it back under podman 4.3 here (no
        systemd: nothing runs the policy; waited 30 s), so it is started."""
        if self.state(service)["Status"] != "running":
            podman("start", self.container(service))

    def state(self, service: str) -> dict:
        return json.loads(podman("inspect", self.container(service)).stdout)[0]["State"]

    def python(self, service: str, code: str, *, timeout: float = 300):
        """Run `code` by `manage.py shell` in the service's container; the
        last line it prints, as JSON."""
        out = self._manage(service, ["shell"], timeout=timeout, code=code)
        return json.loads(out.strip().splitlines()[-1])

    def manage(self, service: str, *args: str, timeout: float = 300) -> str:
        return self._manage(service, list(args), timeout=timeout)

    def _manage(self, service: str, args: list[str], *, timeout: float, code=None) -> str:
        """`manage.py ARGS` in the service's container; its output. A lookup
        of a service's name that fails while podman's DNS (aardvark-dns)
        reloads, right after a container of the network (re)started, is
        tried again for up to 30 s (nothing was written: it fails on
        connecting): seen once in CI, the web container could not resolve
        `postgres` just after the worker was restarted."""
        deadline = time.monotonic() + 30
        while True:
            result = podman(
                "exec", "-i", self.container(service), "python", "manage.py", *args,
                timeout=timeout, input=code or "", check=False,
            )  # fmt: skip
            if result.returncode == 0:
                return result.stdout
            if "failed to resolve host" not in result.stderr or time.monotonic() > deadline:
                raise AssertionError(
                    f"manage.py {' '.join(args)} in {service} exited {result.returncode}:\n"
                    f"{result.stderr[-3000:]}"
                )
            time.sleep(1)

    # --- waiting -----------------------------------------------------------
    def wait_http(self, url: str, *, timeout: float, expect: int = 200) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                last = httpx.get(url, timeout=5).status_code
                if last == expect:
                    return
            except httpx.HTTPError as error:
                last = repr(error)
            time.sleep(1)
        raise AssertionError(f"{url} did not answer {expect} within {timeout:.0f} s (last: {last})")

    def wait_exited(self, service: str, *, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.state(service)
            if state["Status"] == "exited":
                return state["ExitCode"]
            time.sleep(2)
        raise AssertionError(f"{service} still running after {timeout:.0f} s")

    def logs_save(self, services: list[str]) -> None:
        ARTIFACTS.mkdir(exist_ok=True)
        for service in services:
            result = podman("logs", "--tail", "300", self.container(service), check=False)
            (ARTIFACTS / f"compose-{service}.log").write_text(result.stdout + result.stderr)


STARTUP_ORDER = [
    ["postgres", "redis", "vllm-cpu"],
    ["migrate"],
    ["web", "gateway", "worker", "webhooks", "beat", "register-cpu"],
]
SERVICES = [
    "postgres", "redis", "migrate", "web", "gateway", "worker", "webhooks", "beat", "vllm-cpu",
    "register-cpu",
]  # fmt: skip


def stack_make(images: Images, *, project: str, profile: str = "cpu") -> Stack:
    """A stack's settings (the project's images, fresh secrets, free ports),
    nothing started."""
    env = podman_env(
        APP_IMAGE=images.app,
        VLLM_CPU_IMAGE=images.vllm_cpu,
        POSTGRES_IMAGE=images.postgres,
        REDIS_IMAGE=images.redis,
        NATS_IMAGE=images.nats,
        BASE_IMAGE="localhost/debian-base:bookworm",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(32),
        API_KEY_PEPPER=secrets.token_urlsafe(32),
        POSTGRES_PASSWORD=secrets.token_urlsafe(16),
        DJANGO_SECURE_SSL_REDIRECT="false",
    )
    stack = Stack(
        project=project, env=env, web_port=free_port(), gateway_port=free_port(),
        operator_port=free_port(), profile=profile,
    )  # fmt: skip
    env.update(
        WEB_PORT=str(stack.web_port),
        GATEWAY_PORT=str(stack.gateway_port),
        GATEWAY_OPERATOR_PUBLISHED_PORT=str(stack.operator_port),
    )
    return stack


def stack_up(images: Images, *, project: str) -> Stack:
    stack = stack_make(images, project=project)
    stack.compose("down", "-v", "-t", "5", check=False)  # what a killed run left behind
    # In the order depends_on gives, one step at a time: podman 4.3 cannot
    # start a container whose `--requires` reach past its direct
    # dependencies ("... not found in input list"), and ignores
    # `condition: service_healthy` (migrate_when_ready waits for the
    # database itself). Docker runs the file in one `up -d`.
    for step in STARTUP_ORDER:
        stack.compose("up", "-d", "--no-build", "--no-deps", *step)
        if step == ["migrate"]:
            assert stack.wait_exited("migrate", timeout=300) == 0, "migrate failed"
    return stack
