"""The API keys page: owners and admins create (secret shown once) and
revoke; viewers only look; nobody sees or touches another tenant's keys."""

import pytest

from tenants.models import ApiKey
from tenants.services import api_key_authenticate
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


def test_an_owner_creates_a_key_shown_once_and_revokes_it(client, world_a, world_b):
    client.force_login(world_a.owner.user)

    created = client.post("/keys/", {"name": "ci", "scopes": ["inference", "usage:read"]})

    assert created.status_code == 200
    secret = created.context["new_secret"]
    assert secret in created.content.decode()
    key = api_key_authenticate(raw_key=secret)
    assert key.tenant == world_a.tenant and key.scopes == ["inference", "usage:read"]
    listing = client.get("/keys/").content.decode()
    assert secret not in listing and key.display_prefix in listing  # never shown again
    assert world_b.key.display_prefix not in listing

    assert client.post(f"/keys/{key.pk}/revoke/").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    # Another tenant's key id is simply not found, and stays live.
    assert client.post(f"/keys/{world_b.key.pk}/revoke/").status_code == 404
    world_b.key.refresh_from_db()
    assert world_b.key.revoked_at is None


def test_bad_input_names_the_field_and_creates_nothing(client, world_a):
    client.force_login(world_a.owner.user)
    before = ApiKey.objects.count()

    response = client.post("/keys/", {"name": "", "scopes": ["inference"]})
    no_scope = client.post("/keys/", {"name": "x"})

    assert response.status_code == 400 and "name:" in response.content.decode()
    assert no_scope.status_code == 400 and "scopes:" in no_scope.content.decode()
    assert ApiKey.objects.count() == before


def test_a_viewer_sees_keys_but_cannot_create_or_revoke(client, world_a):
    client.force_login(world_a.viewer.user)

    page = client.get("/keys/").content.decode()

    assert 'data-testid="keys"' in page and 'data-testid="create-key"' not in page
    assert client.post("/keys/", {"name": "x", "scopes": ["inference"]}).status_code == 403
    assert client.post(f"/keys/{world_a.key.pk}/revoke/").status_code == 403
    world_a.key.refresh_from_db()
    assert world_a.key.revoked_at is None


def test_finance_staff_without_a_tenant_have_no_keys_page(client, world_a):
    client.force_login(make_finance_user())
    assert client.get("/keys/").status_code == 403
    assert client.get("/").status_code == 200
