"""Error pages wear the site's layout and offer a way back: 403 for a page
the signed-in person may not see, 404 for an unknown address (a sign-in link
for visitors), 500 rendered without any request context. The API keeps its
JSON errors."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from dashboard.views import internal_error
from tests.factories import make_finance_user

pytestmark = pytest.mark.django_db

LAYOUT = '<header class="topbar">'


def test_debug_is_off_so_the_real_handlers_answer(settings):
    assert settings.DEBUG is False


def test_a_tenant_member_on_a_finance_page_gets_403_in_the_layout(client, world_a, world_b):
    client.force_login(world_a.owner.user)

    response = client.get("/finance/")

    page = response.content.decode()
    assert response.status_code == 403
    assert LAYOUT in page and "You cannot open this page" in page
    assert 'href="/" data-testid="back-home"' in page
    assert f'data-testid="signed-in-as">{world_a.owner.user.get_username()}<' in page
    assert world_a.tenant.name in page and world_b.tenant.name not in page
    assert 'href="/keys/"' in page  # the member's own navigation stays


def test_finance_staff_on_a_tenant_page_get_403_in_the_layout(client, world_a):
    client.force_login(make_finance_user())
    response = client.get("/keys/")
    page = response.content.decode()
    assert response.status_code == 403 and LAYOUT in page
    assert 'href="/finance/"' in page and 'data-testid="back-home"' in page


def test_an_unknown_address_is_404_in_the_layout_with_a_way_back(client, world_a):
    client.force_login(world_a.viewer.user)

    response = client.get("/no-such-page/")

    page = response.content.decode()
    assert response.status_code == 404
    assert LAYOUT in page and "Page not found" in page and "/no-such-page/" in page
    assert 'href="/" data-testid="back-home"' in page


def test_a_visitor_on_an_unknown_address_is_offered_sign_in(client, db):
    response = client.get("/nowhere/")
    page = response.content.decode()
    assert response.status_code == 404 and LAYOUT in page
    assert 'href="/login/" data-testid="sign-in"' in page
    assert 'data-testid="signed-in-as"' not in page


def test_an_unknown_object_in_a_page_is_404_in_the_layout(client, world_a, world_b):
    """Another tenant's key: not found, in the layout."""
    client.force_login(world_a.owner.user)
    response = client.post(f"/keys/{world_b.key.pk}/revoke/")
    assert response.status_code == 404 and LAYOUT in response.content.decode()


def test_the_api_keeps_its_json_404(client, world_a):
    response = client.get("/api/v1/no-such-endpoint")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_api_answers_a_refused_host_header_in_json(client, world_a):
    """The schema fuzzer sent an empty Host: Django refuses it before any
    view, and the API must still answer in its documented JSON."""
    response = client.put("/api/v1/tenants/a/budget", {}, HTTP_HOST="")
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "bad_request"
    page = client.get("/finance/", HTTP_HOST="")
    assert page.status_code == 400 and "text/html" in page["Content-Type"]


def test_the_500_page_renders_without_request_context(world_a):
    """Django's server_error renders 500.html with no request and no context
    processors: the layout must still render, with a way back."""
    request = RequestFactory().get("/finance/")
    request.user = world_a.owner.user

    response = internal_error(request)

    page = response.content.decode()
    assert response.status_code == 500
    assert LAYOUT in page and "Something went wrong" in page
    assert 'href="/" data-testid="back-home"' in page
    assert world_a.owner.user.get_username() not in page  # no context was used
