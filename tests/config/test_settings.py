"""Production settings refuse the development secrets every clone knows;
development and tests start with them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from config.settings.base import DEV_SECRET_KEY

PRINT_SECRETS = (
    "import django; django.setup(); from django.conf import settings; "
    "print(settings.SECRET_KEY == settings.API_KEY_PEPPER, settings.DEBUG)"
)
# Production's required settings (tests/config/test_required_settings.py
# starts it without each of them).
OWN = {
    "DJANGO_SECRET_KEY": "s3cret-of-our-own",
    "API_KEY_PEPPER": "pepper-of-our-own",
    "DATABASE_URL": "postgres://user:password@127.0.0.1:9/gpu_ledger",  # never connected
}


def _start(settings_module: str, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k not in {*OWN, "DJANGO_SETTINGS_MODULE"}}
    environment |= {"DJANGO_SETTINGS_MODULE": settings_module, **env}
    return subprocess.run(
        [sys.executable, "-c", PRINT_SECRETS],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


@pytest.mark.parametrize(
    "env, named",
    [
        ({"DJANGO_SECRET_KEY": DEV_SECRET_KEY}, "DJANGO_SECRET_KEY"),
        ({"DJANGO_SECRET_KEY": "change-me"}, "DJANGO_SECRET_KEY"),
        ({"API_KEY_PEPPER": DEV_SECRET_KEY}, "API_KEY_PEPPER"),
    ],
)
def test_production_refuses_development_secrets(env, named):
    started = _start("config.settings.production", **{**OWN, **env})
    assert started.returncode != 0
    assert started.stderr.splitlines() == [
        f"configuration error: {named} is the development default: set a secret of your own"
    ]


def test_production_starts_with_its_own_secrets():
    started = _start("config.settings.production", **OWN)
    assert started.returncode == 0, started.stderr
    assert started.stdout.split() == ["False", "False"]  # its own pepper, no debug


def test_development_starts_on_the_defaults():
    started = _start("config.settings.local")
    assert started.returncode == 0, started.stderr


@pytest.mark.parametrize(
    "providers, named",
    [
        ("[{", "OIDC_PROVIDERS is not JSON"),
        ('{"id": "corp"}', "OIDC_PROVIDERS must be a JSON list"),
        ('[{"id": "corp", "name": "Corp"}]', "OIDC_PROVIDERS[0].issuer is required"),
        (
            '[{"id": "Corp SSO", "name": "C", "issuer": "https://i", "client_id": "c", '
            '"client_secret": "s"}]',
            "OIDC_PROVIDERS[0].id must be lowercase letters",
        ),
        (
            '[{"id": "corp", "name": "C", "issuer": "https://i", "client_id": "c", '
            '"client_secret": "s", "finance_group": "x"}]',
            "OIDC_PROVIDERS[0] has unknown keys ['finance_group']",
        ),
        (
            '[{"id": "corp", "name": "C", "issuer": "https://i", "client_id": "c", '
            '"client_secret": "s", "finance_groups": "finance"}]',
            "OIDC_PROVIDERS[0].finance_groups must be a list of group names",
        ),
    ],
)
def test_a_malformed_identity_provider_list_stops_the_process_naming_the_key(providers, named):
    started = _start("config.settings.local", OIDC_PROVIDERS=providers)
    assert started.returncode == 3
    [line] = started.stderr.splitlines()
    assert line.startswith(f"configuration error: {named}"), line


def test_production_sends_hsts_for_subdomains_and_never_allows_the_test_host():
    """Issue 60, finding 10."""
    check = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.SECURE_HSTS_INCLUDE_SUBDOMAINS, 'testserver' in settings.ALLOWED_HOSTS)"
    )
    environment = {k: v for k, v in os.environ.items() if k not in {*OWN, "DJANGO_SETTINGS_MODULE"}}
    environment |= {"DJANGO_SETTINGS_MODULE": "config.settings.production", **OWN}
    started = subprocess.run(
        [sys.executable, "-c", check], capture_output=True, text=True, env=environment, timeout=120
    )
    assert started.stdout.split() == ["True", "False"], started.stderr
