"""Login, logout and the home page, for tenant members and finance staff."""

import pytest

from tests.factories import PASSWORD, make_finance_user

pytestmark = pytest.mark.django_db


def test_anonymous_home_redirects_to_login(client):
    response = client.get("/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_member_signs_in_and_sees_their_tenant_only(client, world_a, world_b):
    response = client.post(
        "/login/", {"username": world_a.owner.user.username, "password": PASSWORD}
    )
    assert response.status_code == 302
    html = client.get("/").content.decode()
    assert world_a.owner.user.username in html
    assert world_a.tenant.name in html
    assert world_b.tenant.name not in html
    assert 'data-testid="tenant-list"' not in html


def test_wrong_password_is_refused(client, world_a):
    response = client.post("/login/", {"username": world_a.owner.user.username, "password": "x"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()
    assert client.get("/").status_code == 302


def test_finance_staff_see_every_tenant(client, world_a, world_b):
    client.force_login(make_finance_user())
    html = client.get("/").content.decode()
    assert 'data-testid="tenant-list"' in html
    assert world_a.tenant.name in html and world_b.tenant.name in html


def test_logout_ends_the_session(client, world_a):
    client.force_login(world_a.owner.user)
    assert client.get("/").status_code == 200
    assert client.post("/logout/").status_code == 302
    assert client.get("/").status_code == 302


def test_finance_api_lists_tenants_but_members_cannot(world_a, world_b):
    from tests.conftest import client_for_key, client_for_user

    finance = client_for_user(make_finance_user())
    slugs = {t["slug"] for t in finance.get("/api/v1/tenants").json()}
    assert {world_a.tenant.slug, world_b.tenant.slug} <= slugs
    assert client_for_user(world_a.owner.user).get("/api/v1/tenants").status_code == 403
    assert client_for_key(world_a.secret).get("/api/v1/tenants").status_code == 403
