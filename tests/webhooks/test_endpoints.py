"""Registering endpoints: where they may point, which events each may hear,
and that one tenant never sees another's (through the API and the page)."""

from __future__ import annotations

import pytest

from tenants.choices import Role
from tests.factories import make_finance_user, make_key, make_member
from tests.webhooks.helpers import endpoint_post, endpoint_registered
from webhooks.models import Endpoint

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("ftp://hooks.example.com/x", "must be an https:// URL"),
        ("http://hooks.example.com/x", "must be an https:// URL (plain http only to loopback"),
        ("https://user:pw@93.184.215.14/x", "must not carry a user or password"),
        ("https://10.0.0.7/hooks", "resolves to a non-public address (10.0.0.7)"),
        ("https://169.254.169.254/latest", "resolves to a non-public address (169.254.169.254)"),
        ("https://[fd00::1]/hooks", "resolves to a non-public address (fd00::1)"),
        ("https://no-such-host.invalid/x", "does not resolve"),
    ],
)
def test_an_endpoint_url_it_will_not_call_is_a_400_naming_url(api, world_a, url, reason):
    answer = endpoint_post(api, world_a.owner.user, url, ["invoice.paid"])
    assert answer.status_code == 400
    assert answer.json()["error"]["field"] == "url"
    assert reason in answer.json()["error"]["details"][0]["message"]
    assert not Endpoint.objects.exists()


def test_loopback_only_in_development_and_private_ranges_only_when_the_operator_allows(
    api, world_a, settings
):
    owner = world_a.owner.user
    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_LOOPBACK": False}
    assert endpoint_post(api, owner, "http://127.0.0.1:9/x", ["invoice.paid"]).status_code == 400
    refused = endpoint_post(api, owner, "https://127.0.0.1:9/x", ["invoice.paid"])
    assert "non-public address (127.0.0.1)" in refused.json()["error"]["message"]

    settings.WEBHOOKS = {**settings.WEBHOOKS, "ALLOW_PRIVATE": True}
    assert endpoint_post(api, owner, "https://10.0.0.7/hooks", ["invoice.paid"]).status_code == 201
    assert endpoint_post(api, owner, "http://10.0.0.7/hooks", ["invoice.paid"]).status_code == 400


def test_a_tenant_hears_only_tenant_events_and_the_operator_all(api, world_a):
    owner = world_a.owner.user
    refused = endpoint_post(api, owner, "https://93.184.215.14/x", ["invoice.paid", "replica.down"])
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["field"] == "event_types"
    assert "'replica.down' is not an event a tenant may hear" in error["message"]
    unknown = endpoint_post(api, owner, "https://93.184.215.14/x", ["invoice.exploded"])
    assert unknown.json()["error"]["field"] == "event_types"
    assert endpoint_post(api, owner, "https://93.184.215.14/x", []).status_code == 400

    operator = endpoint_post(
        api, make_finance_user(), "https://93.184.215.14/ops", ["replica.down"]
    )
    assert operator.status_code == 201 and operator.json()["tenant"] is None
    assert operator.json()["secret"].startswith("whsec_")
    assert not Endpoint.objects.filter(tenant=world_a.tenant).exists()


def test_one_tenant_never_sees_anothers_endpoints(api, client, world_a, world_b):
    theirs = endpoint_registered(api, world_a.owner.user, "https://93.184.215.14/a", "invoice.paid")
    api.force_login(world_b.owner.user)
    assert api.get("/api/v1/webhooks/endpoints").json() == []
    assert api.get(f"/api/v1/webhooks/endpoints/{theirs['id']}").status_code == 404
    assert api.delete(f"/api/v1/webhooks/endpoints/{theirs['id']}").status_code == 404
    assert Endpoint.objects.filter(pk=theirs["id"]).exists()

    client.force_login(world_b.owner.user)
    page = client.get("/webhooks/").content.decode()
    assert "93.184.215.14/a" not in page and theirs["secret"] not in page
    client.force_login(world_a.owner.user)
    assert theirs["secret"] in client.get("/webhooks/").content.decode()

    viewer = make_member(world_a.tenant, Role.VIEWER).user
    client.force_login(viewer)
    assert client.get("/webhooks/").status_code == 403
    api.force_login(viewer)
    assert api.get("/api/v1/webhooks/endpoints").status_code == 403
    _, secret = make_key(world_a.tenant)
    api.logout()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert api.get("/api/v1/webhooks/endpoints").status_code == 403


def test_the_page_adds_an_endpoint_and_names_a_bad_field(client, world_a):
    client.force_login(world_a.owner.user)
    bad = client.post(
        "/webhooks/",
        {"action": "create", "url": "http://hooks.example.com/x", "event_types": ["invoice.paid"]},
    )
    assert bad.status_code == 400 and 'data-testid="error-url"' in bad.content.decode()
    assert not Endpoint.objects.exists()
    good = client.post(
        "/webhooks/",
        {"action": "create", "url": "https://93.184.215.14/x", "event_types": ["invoice.paid"]},
    )
    assert good.status_code == 303
    endpoint = Endpoint.objects.get()
    assert endpoint.tenant == world_a.tenant and endpoint.event_types == ["invoice.paid"]
    client.post("/webhooks/", {"action": "disable", "endpoint": endpoint.pk})
    endpoint.refresh_from_db()
    assert not endpoint.active
