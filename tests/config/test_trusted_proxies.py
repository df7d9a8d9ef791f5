"""X-Forwarded-Proto believed only from the configured proxies (issue 60,
finding 10), against the web app as its container runs it (`manage.py web`
under production settings): a caller that is not a trusted proxy claiming
HTTPS over plain HTTP is redirected to HTTPS and handed no page, as if it
had sent nothing; the same claim from the TLS proxy (loopback here) is
served, its cookies marked Secure. A bad WEB_TRUSTED_PROXIES stops the
process at once naming it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from core.processes import ManagedProcess, database_url_for_subprocess
from tests.services import free_port

ROOT = Path(__file__).resolve().parents[2]
PRODUCTION = {
    "DJANGO_SETTINGS_MODULE": "config.settings.production",
    "DJANGO_SECRET_KEY": "s3cret-of-our-own",
    "API_KEY_PEPPER": "pepper-of-our-own",
    "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
    "REDIS_URL": "",
}
CLAIM = {"X-Forwarded-Proto": "https", "X-Forwarded-For": "203.0.113.9"}


def _web(tmp_path: Path, trusted: str) -> tuple[ManagedProcess, str]:
    port = free_port()
    web = ManagedProcess(
        name=f"web-proxies-{port}",
        argv=[sys.executable, "manage.py", "web", "--host", "127.0.0.1", "--port", str(port)],
        env={
            **PRODUCTION,
            "DATABASE_URL": database_url_for_subprocess(),
            "WEB_TRUSTED_PROXIES": trusted,
        },
        log_path=tmp_path / f"web-{port}.log",
        ready_url=f"http://127.0.0.1:{port}/healthz",
    )
    web.start()
    web.wait_ready(timeout=60)
    return web, f"http://127.0.0.1:{port}"


@pytest.mark.django_db(transaction=True)
def test_https_is_believed_only_from_a_trusted_proxy(tmp_path):
    untrusting, elsewhere = _web(tmp_path, "10.9.9.9,192.0.2.0/24")
    try:
        claimed = httpx.get(f"{elsewhere}/login/", headers=CLAIM)
        assert claimed.status_code == 301, claimed.text[:200]
        assert claimed.headers["location"] == f"{elsewhere.replace('http', 'https')}/login/"
        assert "set-cookie" not in claimed.headers
    finally:
        untrusting.stop()

    trusting, behind_proxy = _web(tmp_path, "127.0.0.1")
    try:
        plain = httpx.get(f"{behind_proxy}/login/")
        assert plain.status_code == 301  # the proxy said nothing: plain HTTP
        served = httpx.get(f"{behind_proxy}/login/", headers=CLAIM)
        assert served.status_code == 200
        cookie = served.headers["set-cookie"]
        assert cookie.startswith("csrftoken=") and "Secure" in cookie
        assert "strict-transport-security" in served.headers
    finally:
        trusting.stop()


@pytest.mark.parametrize(
    ("value", "named"),
    [
        ("*", "not '*'"),
        ("127.0.0.1,proxy.example.com", "'proxy.example.com' is not an IP address or network"),
    ],
)
def test_a_bad_trusted_proxies_setting_stops_the_web_app_naming_it(value, named):
    environment = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    environment |= {
        **PRODUCTION,
        "DATABASE_URL": "postgres://user:password@127.0.0.1:9/gpu_ledger",  # never reached
        "WEB_TRUSTED_PROXIES": value,
    }
    done = subprocess.run(
        [sys.executable, "manage.py", "web", "--port", "0"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "WEB_TRUSTED_PROXIES" in lines[0] and named in lines[0], lines
