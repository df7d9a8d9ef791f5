"""seed_demo builds the demo world once; a second run changes nothing."""

import io
import json
import stat

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from tenants.models import ApiKey, Membership, Tenant, TenantPolicy
from tenants.selectors import user_is_finance_staff
from tenants.services import api_key_authenticate

pytestmark = pytest.mark.django_db

MODELS = [Tenant, TenantPolicy, Membership, ApiKey, get_user_model()]


def counts():
    return {m.__name__: m.objects.count() for m in MODELS}


def test_seed_twice_changes_nothing(tmp_path):
    secrets_file = tmp_path / "keys.json"
    out = io.StringIO()
    call_command("seed_demo", secrets_file=secrets_file, stdout=out)
    first = counts()
    first_secrets = secrets_file.read_text()
    assert first["Tenant"] == 6
    assert {t.tier for t in Tenant.objects.all()} == {"shared", "reserved", "dedicated"}
    assert first["ApiKey"] == 6

    call_command("seed_demo", secrets_file=secrets_file, stdout=io.StringIO())
    assert counts() == first
    assert secrets_file.read_text() == first_secrets

    secrets = json.loads(first_secrets)
    for slug, secret in secrets.items():
        assert api_key_authenticate(raw_key=secret).tenant.slug == slug
        assert secret not in out.getvalue()  # never printed
    assert stat.S_IMODE(secrets_file.stat().st_mode) == 0o600
    assert user_is_finance_staff(user=get_user_model().objects.get(username="finance"))


def test_lost_secrets_file_rotates_the_demo_keys(tmp_path):
    secrets_file = tmp_path / "keys.json"
    call_command("seed_demo", secrets_file=secrets_file, stdout=io.StringIO())
    old = json.loads(secrets_file.read_text())
    secrets_file.unlink()
    call_command("seed_demo", secrets_file=secrets_file, stdout=io.StringIO())
    new = json.loads(secrets_file.read_text())
    assert set(new) == set(old)
    assert ApiKey.objects.filter(revoked_at__isnull=True).count() == 6
    for secret in new.values():
        api_key_authenticate(raw_key=secret)
