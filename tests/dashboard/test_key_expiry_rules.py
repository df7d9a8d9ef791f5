"""An API key's expiry follows one rule on the keys page and in the API
(issue 40, item 3): the page used to accept 9999-12-31. Both call
api_key_create, which refuses an expiry outside the supported span, in
the past, or more than 366 days ahead, naming expires_at, with the same
words, and creates no key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from dashboard.account import NEW_SECRET_SESSION_KEY
from tenants.models import ApiKey
from tests.conftest import client_for_user

pytestmark = pytest.mark.django_db

OUT_OF_RANGE = "must be between 2000-01-01 and 2100-01-01 (UTC), inclusive"
TOO_LATE = "must be at most 366 days ahead (leave it empty for a key that does not expire)"


def _day(days: int) -> str:
    return (timezone.now() + timedelta(days=days)).date().isoformat()


@pytest.mark.parametrize(
    ("day", "problem"),
    [
        ("9999-12-31", OUT_OF_RANGE),
        ("0001-01-01", OUT_OF_RANGE),
        ("2100-01-02", OUT_OF_RANGE),
        (368, TOO_LATE),  # days from now: read when the test runs, on the suite's clock
        (-1, "must be in the future"),
    ],
)
def test_an_expiry_the_api_refuses_the_page_refuses_alike(client, world_a, world_b, day, problem):
    day = _day(day) if isinstance(day, int) else day
    client.force_login(world_a.owner.user)
    keys_before = sorted(ApiKey.objects.values_list("pk", flat=True))

    response = client.post("/keys/", {"name": "late", "scopes": ["inference"], "expires_at": day})

    assert response.status_code == 400
    page = response.content.decode()
    assert f"expires_at: {problem}" in page.replace("&#x27;", "'").replace("&quot;", '"')
    assert 'value="late"' in page  # what was typed is kept
    assert NEW_SECRET_SESSION_KEY not in client.session
    refused = client_for_user(world_a.owner.user).post(
        "/api/v1/api-keys",
        {"name": "late", "scopes": ["inference"], "expires_at": f"{day}T00:00:00Z"},
        format="json",
    )
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert (error["field"], error["message"]) == ("expires_at", f"expires_at: {problem}")
    assert sorted(ApiKey.objects.values_list("pk", flat=True)) == keys_before


def test_an_expiry_up_to_366_days_ahead_is_a_key_of_that_tenant_only(client, world_a, world_b):
    client.force_login(world_a.owner.user)
    day = (timezone.now() + timedelta(days=366)).date()

    created = client.post(
        "/keys/", {"name": "yearly", "scopes": ["inference"], "expires_at": day.isoformat()}
    )

    assert created.status_code == 303
    key = ApiKey.objects.get(name="yearly")
    assert key.tenant == world_a.tenant
    assert key.expires_at == datetime(day.year, day.month, day.day, tzinfo=UTC)
    assert not ApiKey.objects.filter(tenant=world_b.tenant, name="yearly").exists()
