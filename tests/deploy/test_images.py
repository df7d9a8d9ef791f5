"""The images build from this checkout and hold what the roles need: every
top-level package of the project (so the next new app cannot be left out of
the image, as core/, gateway/, dashboard/ and demo/ once were), templates
and collected static files, no tests and no dev tools; a non-root user and
a HEALTHCHECK."""

from __future__ import annotations

import fnmatch
import json
import tomllib

import pytest

from tests.deploy.podman import ROOT, podman

# What is not an app of the product: the test suite and the benchmarks.
NOT_SHIPPED = {"tests", "bench"}


def project_packages() -> set[str]:
    return {
        p.parent.name
        for p in ROOT.glob("*/__init__.py")
        if p.parent.name not in NOT_SHIPPED and not p.parent.name.startswith(".")
    }


def test_the_package_list_and_the_build_context_miss_no_app():
    """Without starting a container: pyproject's package list and the
    .dockerignore (the image copies the whole context) cover every app."""
    packages = project_packages()
    assert {"config", "core", "gateway", "dashboard", "demo", "billing"} <= packages
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "packages"
    ]["find"]["include"]
    assert {p for p in packages if not any(fnmatch.fnmatch(p, pat) for pat in include)} == set()
    ignored = [
        line.strip().rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    shipped = {"templates", "static", "manage.py", "pyproject.toml", *packages}
    assert {p for p in shipped if any(fnmatch.fnmatch(p, pat) for pat in ignored)} == set()
    assert {"tests", "bench", ".git", ".venv*", "var"} <= set(ignored)


FIND = (
    "import importlib.util, json, sys; "
    "print(json.dumps({p: importlib.util.find_spec(p) is not None for p in sys.argv[1:]}))"
)


def test_the_app_image_holds_every_app_and_no_dev_tools(images):
    packages = sorted(project_packages())
    found = json.loads(
        podman("run", "--rm", images.app, "python", "-c", FIND, *packages, "pytest", "ruff",
               "factory", "tests", "bench").stdout
    )  # fmt: skip
    assert [p for p in packages if not found[p]] == []
    assert [p for p in ("pytest", "ruff", "factory", "tests", "bench") if found[p]] == []
    listing = podman(
        "run", "--rm", images.app, "sh", "-c",
        "id -u; ls /app; ls /app/staticfiles | head -3; test -w /app/var && echo var-writable",
    ).stdout.split()  # fmt: skip
    assert listing[0] == "10001"  # the image's own non-root user
    assert {"templates", "staticfiles", "manage.py", "var-writable"} <= set(listing)
    assert "tests" not in listing and "bench" not in listing


@pytest.mark.parametrize("which", ["app", "vllm_cpu", "postgres", "redis"])
def test_every_image_runs_as_non_root_with_a_healthcheck(images, which):
    image = getattr(images, which)
    inspected = json.loads(podman("image", "inspect", image).stdout)[0]
    assert inspected["Config"].get("User") not in (None, "", "root", "0")
    # Kept in the image's Docker-format config (podman shows it at the top).
    assert inspected["Healthcheck"]["Test"][0] in ("CMD", "CMD-SHELL")


@pytest.mark.parametrize("setting", ["DJANGO_SECRET_KEY", "DATABASE_URL", "API_KEY_PEPPER"])
def test_a_container_without_a_required_setting_exits_at_start_naming_it(images, setting):
    """The image's own command (the web role) and the gateway's: one line
    naming the setting, a non-zero exit, nothing started."""
    given = {
        "DJANGO_SECRET_KEY": "a-secret-of-this-test",
        "DATABASE_URL": "postgres://u:p@127.0.0.1:1/db",
        "API_KEY_PEPPER": "a-pepper-of-this-test",
    }
    env = [f"--env={k}={v}" for k, v in given.items() if k != setting]
    gateway = ["python", "manage.py", "gateway", "--host", "0.0.0.0"]  # noqa: S104 (in a container)
    for command in ([], gateway):
        result = podman(
            "run", "--rm", "--no-healthcheck", *env, images.app, *command, check=False, timeout=120
        )  # --no-healthcheck: podman says nothing of its own on stderr
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 3, result.stderr
        assert len(lines) == 1 and lines[0].startswith("configuration error:"), result.stderr
        assert setting in lines[0] and "Traceback" not in result.stderr
