"""/api/v1/api-keys: owners and admins manage their own tenant's keys only."""

from datetime import timedelta

import pytest
from django.utils import timezone

from tenants.choices import Role, Scope
from tenants.models import ApiKey
from tenants.services import api_key_authenticate
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_member

pytestmark = pytest.mark.django_db

URL = "/api/v1/api-keys"


def revoke_url(key_id: int) -> str:
    return f"{URL}/{key_id}/revoke"


def test_owner_creates_a_key_whose_secret_works_and_is_shown_once(world_a):
    client = client_for_user(world_a.owner.user)
    response = client.post(
        URL, {"name": "ci bot", "scopes": ["inference", "usage:read"]}, format="json"
    )
    assert response.status_code == 201
    body = response.json()
    secret = body["secret"]
    assert secret.startswith("glk_")
    assert body["scopes"] == ["inference", "usage:read"]
    assert body["status"] == "active"
    assert body["created_by"] == world_a.owner.user.username
    assert api_key_authenticate(raw_key=secret).pk == body["id"]

    listed = client.get(URL).json()
    assert {k["id"] for k in listed} == {world_a.key.pk, body["id"]}
    assert all("secret" not in k and "secret_hash" not in k for k in listed)
    assert secret not in client.get(URL).content.decode()


def test_admin_may_manage_keys_but_viewer_may_not(world_a):
    admin = make_member(world_a.tenant, Role.ADMIN)
    assert client_for_user(admin.user).get(URL).status_code == 200
    viewer = client_for_user(world_a.viewer.user)
    response = viewer.post(URL, {"name": "x", "scopes": ["inference"]}, format="json")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert viewer.get(URL).status_code == 403
    assert ApiKey.objects.filter(tenant=world_a.tenant).count() == 1


def test_an_api_key_cannot_manage_keys(world_a):
    response = client_for_key(world_a.secret).get(URL)
    assert response.status_code == 403
    assert "owners and admins" in response.json()["error"]["message"]


def test_revoke_stops_the_key_and_is_idempotent(world_a):
    client = client_for_user(world_a.owner.user)
    first = client.post(revoke_url(world_a.key.pk))
    assert first.status_code == 200
    assert first.json()["status"] == "revoked"
    second = client.post(revoke_url(world_a.key.pk))
    assert second.json()["revoked_at"] == first.json()["revoked_at"]
    assert client_for_key(world_a.secret).get("/api/v1/tenants/me").status_code == 401


class TestIsolation:
    def test_session_lists_only_own_keys(self, world_a, world_b):
        ids = {k["id"] for k in client_for_user(world_a.owner.user).get(URL).json()}
        assert ids == {world_a.key.pk}

    def test_session_cannot_revoke_another_tenants_key(self, world_a, world_b):
        response = client_for_user(world_a.owner.user).post(revoke_url(world_b.key.pk))
        assert response.status_code == 404
        assert response.json()["error"]["code"] == "not_found"
        world_b.key.refresh_from_db()
        assert world_b.key.revoked_at is None
        assert api_key_authenticate(raw_key=world_b.secret).pk == world_b.key.pk

    def test_key_cannot_list_or_revoke_another_tenants_keys(self, world_a, world_b):
        client = client_for_key(world_a.secret)
        assert client.get(URL).status_code == 403
        assert client.post(revoke_url(world_b.key.pk)).status_code == 403
        world_b.key.refresh_from_db()
        assert world_b.key.revoked_at is None

    def test_tenant_me_never_shows_the_other_tenant(self, world_a, world_b):
        for client in (client_for_key(world_a.secret), client_for_user(world_a.owner.user)):
            body = client.get("/api/v1/tenants/me").json()
            assert body["tenant"]["slug"] == world_a.tenant.slug
            assert world_b.tenant.slug not in str(body)


class TestBadInput:
    """400 naming the field, and no key created."""

    @pytest.mark.parametrize(
        ("payload", "field", "code"),
        [
            ({"name": "k", "scopes": ["admin"]}, "scopes.0", "invalid_choice"),
            ({"name": "k", "scopes": []}, "scopes", "empty"),
            ({"name": "k"}, "scopes", "required"),
            ({"name": "x" * 101, "scopes": ["inference"]}, "name", "max_length"),
            ({"name": "", "scopes": ["inference"]}, "name", "blank"),
            (
                {"name": "k", "scopes": ["inference"], "expires_at": "yesterday"},
                "expires_at",
                "invalid",
            ),
        ],
    )
    def test_rejected_by_the_serializer(self, world_a, payload, field, code):
        self._assert_rejected(world_a, payload, field, code)

    def test_expiry_in_the_past(self, world_a):
        past = (timezone.now() - timedelta(minutes=1)).isoformat()
        payload = {"name": "k", "scopes": ["inference"], "expires_at": past}
        self._assert_rejected(world_a, payload, "expires_at", "invalid")

    def test_body_that_is_not_json(self, world_a):
        client = client_for_user(world_a.owner.user)
        response = client.generic("POST", URL, "{not json", content_type="application/json")
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "parse_error"
        assert ApiKey.objects.filter(tenant=world_a.tenant).count() == 1

    def _assert_rejected(self, world, payload, field, code):
        client = client_for_user(world.owner.user)
        response = client.post(URL, payload, format="json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["field"] == field
        assert error["code"] == code
        assert field in error["message"]
        assert ApiKey.objects.filter(tenant=world.tenant).count() == 1


def test_expiry_in_the_future_is_kept(world_a):
    at = timezone.now() + timedelta(days=30)
    response = client_for_user(world_a.owner.user).post(
        URL,
        {"name": "temp", "scopes": [Scope.USAGE_READ], "expires_at": at.isoformat()},
        format="json",
    )
    assert response.status_code == 201
    assert ApiKey.objects.get(pk=response.json()["id"]).expires_at == at
