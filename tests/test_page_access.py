"""Who may open which page, for every page of the dashboard: anonymous
visitors are sent to sign in; a tenant's members see their own tenant's
pages and not finance's; finance staff see finance's pages and not a
tenant portal (they drill into a tenant instead); a viewer cannot create
keys."""

from __future__ import annotations

import pytest

from serving.models import ServedModel
from tests.factories import make_finance_user

FINANCE_PAGES = [
    "/finance/",
    "/costs/",
    "/fleet/",
    "/reconciliation/",
    "/finance/tenants/{slug}/",
    "/finance/models/tiny-llama/",
    "/finance/receivables/",
    "/finance/slo/",
    "/finance/tax/",
    "/finance/prices/",
    "/finance/tenants/{slug}/terms/",
    "/finance/plan/",
    "/finance/archives/",
    "/jobs/",
]
TENANT_PAGES = ["/usage/", "/keys/"]
SHARED_PAGES = ["/", "/invoices/"]
ALL = FINANCE_PAGES + TENANT_PAGES + SHARED_PAGES


@pytest.fixture
def people(world_a):
    ServedModel.objects.create(name="tiny-llama")
    return {
        "finance": make_finance_user(),
        "owner": world_a.owner.user,
        "viewer": world_a.viewer.user,
        "slug": world_a.tenant.slug,
    }


@pytest.mark.parametrize("path", ALL)
def test_anonymous_visitors_are_sent_to_sign_in(client, people, path):
    response = client.get(path.format(slug=people["slug"]))
    assert response.status_code == 302 and response.url.startswith("/login/")


@pytest.mark.parametrize("who", ["owner", "viewer"])
@pytest.mark.parametrize("path", ALL)
def test_tenant_members_see_their_pages_and_not_finances(client, people, who, path):
    client.force_login(people[who])
    expected = 403 if path in FINANCE_PAGES else 200
    assert client.get(path.format(slug=people["slug"])).status_code == expected


@pytest.mark.parametrize("path", ALL)
def test_finance_staff_see_finance_pages_and_no_tenant_portal(client, people, path):
    client.force_login(people["finance"])
    expected = 403 if path in TENANT_PAGES else 200
    assert client.get(path.format(slug=people["slug"])).status_code == expected


def test_a_viewer_cannot_create_a_key_but_an_owner_can(client, people, world_a):
    client.force_login(people["viewer"])
    assert client.post("/keys/", {"name": "v", "scopes": ["inference"]}).status_code == 403
    client.force_login(people["owner"])
    assert client.post("/keys/", {"name": "o", "scopes": ["inference"]}).status_code == 303
