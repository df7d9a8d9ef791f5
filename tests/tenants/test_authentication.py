"""API key authentication: the statuses and error shape clients rely on."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.choices import TenantStatus
from tenants.models import ApiKey
from tenants.services import api_key_revoke, tenant_set_status
from tests.conftest import client_for_key
from tests.factories import make_key

pytestmark = pytest.mark.django_db

ME = "/api/v1/tenants/me"


def assert_error(response, status: int, code: str):
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    assert "field" in body["error"]


def test_live_key_answers_with_its_tenant(world_a):
    body = client_for_key(world_a.secret).get(ME).json()
    assert body["tenant"]["slug"] == world_a.tenant.slug
    assert body["api_key"] == world_a.key.display_prefix
    assert body["role"] is None
    assert body["scopes"] == sorted(world_a.key.scopes)


def test_revoked_key_is_401(world_a):
    api_key_revoke(tenant=world_a.tenant, key_id=world_a.key.pk)
    response = client_for_key(world_a.secret).get(ME)
    assert_error(response, 401, "authentication_failed")
    assert "revoked" in response.json()["error"]["message"]
    assert response["WWW-Authenticate"].startswith("Bearer")


def test_expired_key_is_401(world_a):
    key, secret = make_key(world_a.tenant, expires_at=timezone.now() + timedelta(seconds=30))
    ApiKey.objects.filter(pk=key.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    response = client_for_key(secret).get(ME)
    assert_error(response, 401, "authentication_failed")
    assert "expired" in response.json()["error"]["message"]


def test_suspended_tenants_key_is_403(world_a, world_b):
    tenant_set_status(tenant=world_a.tenant, status=TenantStatus.SUSPENDED)
    assert_error(client_for_key(world_a.secret).get(ME), 403, "tenant_suspended")
    assert client_for_key(world_b.secret).get(ME).status_code == 200


@pytest.mark.parametrize(
    "header",
    ["Bearer", "Basic dXNlcjpwYXNz", "Bearer a b", "Token glk_x", "glk_only"],
)
def test_malformed_authorization_header_is_401(world_a, api, header):
    api.credentials(HTTP_AUTHORIZATION=header)
    assert_error(api.get(ME), 401, "malformed_authorization")


def test_wrong_secret_with_a_real_prefix_is_401(world_a, api):
    tampered = world_a.secret[:-1] + ("A" if world_a.secret[-1] != "A" else "B")
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {tampered}")
    assert_error(api.get(ME), 401, "authentication_failed")


def test_no_credentials_is_401(db, api):
    assert_error(api.get(ME), 401, "not_authenticated")


def test_unknown_api_path_is_json_404(db, api):
    response = api.get("/api/v1/no-such-thing")
    assert_error(response, 404, "not_found")
