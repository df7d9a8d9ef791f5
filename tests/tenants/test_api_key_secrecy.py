"""A key's secret is shown once and is not recoverable afterwards: not from
the database, the admin, the API, or the logs."""

import logging

import pytest
from django.db import connection

from tenants.keys import key_hash
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key

pytestmark = pytest.mark.django_db


def _all_text_in_api_key_table() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT row_to_json(k)::text FROM tenants_apikey k")
        return "\n".join(row[0] for row in cursor.fetchall())


def test_database_holds_only_an_hmac(world_a):
    stored = _all_text_in_api_key_table()
    _, secret_part = world_a.secret.rsplit("_", 1)
    assert world_a.secret not in stored
    assert secret_part not in stored
    assert key_hash(world_a.secret) in stored  # what we keep instead


def test_admin_never_shows_secret_or_hash(world_a, client):
    admin_user = make_finance_user(is_staff=True, is_superuser=True)
    client.force_login(admin_user)
    pages = [
        client.get("/admin/tenants/apikey/"),
        client.get(f"/admin/tenants/apikey/{world_a.key.pk}/change/"),
    ]
    stored_hash = key_hash(world_a.secret)
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert world_a.key.prefix in html  # the visible part is there
        assert world_a.secret not in html
        assert stored_hash not in html
    assert client.get("/admin/tenants/apikey/add/").status_code == 403


def test_secret_never_reaches_the_logs(world_a, caplog):
    caplog.set_level(logging.DEBUG)
    client = client_for_user(world_a.owner.user)
    response = client.post(
        "/api/v1/api-keys", {"name": "logged?", "scopes": ["inference"]}, format="json"
    )
    secret = response.json()["secret"]
    client.get("/api/v1/api-keys")
    _, other_secret = make_key(world_a.tenant)
    client_for_key(other_secret).get("/api/v1/tenants/me")
    client_for_key(other_secret[:-2] + "zz").get("/api/v1/tenants/me")  # a failure is logged
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert caplog.records, "expected the requests to log something (e.g. SQL, warnings)"
    assert secret not in logged
    assert other_secret not in logged
    assert other_secret.rsplit("_", 1)[1] not in logged
