"""The API keys page: owners and admins create (redirect after POST, the
secret shown once, an optional expiry day) and revoke; viewers only look;
nobody sees or touches another tenant's keys."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from dashboard.account import NEW_SECRET_SESSION_KEY
from tenants.choices import Role
from tenants.models import ApiKey
from tenants.services import api_key_authenticate, membership_set
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db


def test_an_owner_creates_a_key_shown_once_and_revokes_it(client, world_a, world_b):
    client.force_login(world_a.owner.user)
    before = ApiKey.objects.count()

    created = client.post("/keys/", {"name": "ci", "scopes": ["inference", "usage:read"]})

    # Redirect after POST: a refresh of the result cannot submit again.
    assert created.status_code == 303 and created["Location"] == "/keys/"
    assert "glk_" not in created.content.decode()
    assert ApiKey.objects.count() == before + 1
    shown = client.get("/keys/")
    secret = shown.context["new_secret"]
    assert secret and secret in shown.content.decode()
    assert shown["Cache-Control"] == "no-store"
    key = api_key_authenticate(raw_key=secret)
    assert key.tenant == world_a.tenant and key.scopes == ["inference", "usage:read"]
    assert NEW_SECRET_SESSION_KEY not in client.session  # dropped once shown
    listing = client.get("/keys/").content.decode()  # the refresh
    assert secret not in listing and key.display_prefix in listing  # never shown again
    assert world_b.key.display_prefix not in listing
    assert ApiKey.objects.count() == before + 1  # and nothing created again

    assert client.post(f"/keys/{key.pk}/revoke/").status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None
    # Another tenant's key id is simply not found, and stays live.
    assert client.post(f"/keys/{world_b.key.pk}/revoke/").status_code == 404
    world_b.key.refresh_from_db()
    assert world_b.key.revoked_at is None


def test_the_secret_is_shown_only_for_the_tenant_it_was_made_for(client, world_a, world_b):
    """A member of two tenants who switches before the page loads does not
    see tenant A's new secret on tenant B's page."""
    user = world_a.owner.user
    membership_set(tenant=world_b.tenant, user=user, role=Role.OWNER)
    client.force_login(user)
    client.post("/tenant/switch/", {"tenant": world_a.tenant.slug})
    client.post("/keys/", {"name": "a-key", "scopes": ["inference"]})
    client.post("/tenant/switch/", {"tenant": world_b.tenant.slug})

    page = client.get("/keys/")

    assert (
        page.context["new_secret"] is None and 'data-testid="secret"' not in page.content.decode()
    )


def test_a_key_with_an_expiry_day_expires_at_its_start_in_utc(client, world_a):
    client.force_login(world_a.owner.user)
    day = (timezone.now() + timedelta(days=30)).date()

    created = client.post(
        "/keys/", {"name": "temp", "scopes": ["inference"], "expires_at": day.isoformat()}
    )

    assert created.status_code == 303
    key = ApiKey.objects.get(tenant=world_a.tenant, name="temp")
    assert key.expires_at == datetime(day.year, day.month, day.day, tzinfo=UTC)
    page = client.get("/keys/").content.decode()
    assert f"{day:%Y-%m-%d} 00:00" in page and 'name="expires_at"' in page


@pytest.mark.parametrize(
    ("expires_at", "problem"),
    [
        ("2020-01-01", "must be in the future"),
        ("today", "YYYY-MM-DD"),
        ("2026-02-30", "YYYY-MM-DD"),
    ],
)
def test_a_bad_expiry_is_400_naming_the_field_and_creates_nothing(
    client, world_a, expires_at, problem
):
    client.force_login(world_a.owner.user)
    before = ApiKey.objects.count()

    response = client.post(
        "/keys/", {"name": "late", "scopes": ["inference"], "expires_at": expires_at}
    )

    page = response.content.decode()
    assert response.status_code == 400
    assert "expires_at:" in page and problem in page
    assert 'value="late"' in page  # what was typed is kept
    assert ApiKey.objects.count() == before
    assert NEW_SECRET_SESSION_KEY not in client.session


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
