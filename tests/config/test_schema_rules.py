"""The OpenAPI schema says what the API does, where a schema-driven client
found it did not: a tenant's `policy` may be null; the audit filters
enumerate the values they take (any other is a 400); a filter or query
parameter sent empty (`until=`, `run=`, `pool=`) is a 400 naming it;
`end` equal to `start` is a 400 naming `end`, and `end`'s description says
so."""

from __future__ import annotations

import pytest

from audit.choices import Action, Via
from audit.tracked import TRACKED
from tenants.models import TenantPolicy
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key, make_tenant

pytestmark = pytest.mark.django_db


@pytest.fixture
def finance():
    return client_for_user(make_finance_user())


@pytest.fixture
def schema(finance) -> dict:
    answer = finance.get("/api/schema/", {"format": "json"})
    assert answer.status_code == 200
    return answer.json()


def _field(answer) -> str:
    assert answer.status_code == 400, answer.content
    return answer.json()["error"]["field"]


def test_a_tenant_without_a_policy_reads_policy_null_as_the_schema_allows(schema):
    yen = make_tenant(name="Yen KK", billing_currency="JPY")
    euro = make_tenant(name="Euro Co", billing_currency="EUR")
    TenantPolicy.objects.filter(tenant=yen).delete()
    _key, secret = make_key(yen)

    me = client_for_key(secret).get("/api/v1/tenants/me")

    assert me.status_code == 200, me.json()
    assert me.json()["tenant"]["slug"] == yen.slug and me.json()["tenant"]["policy"] is None
    policy = schema["components"]["schemas"]["TenantOut"]["properties"]["policy"]
    assert policy.get("nullable") is True
    _key, secret = make_key(euro)
    assert client_for_key(secret).get("/api/v1/tenants/me").json()["tenant"]["slug"] == euro.slug


def test_the_audit_filters_enumerate_their_values(schema, finance):
    parameters = {
        p["name"]: p for p in schema["paths"]["/api/v1/audit/entries"]["get"]["parameters"]
    }

    assert parameters["action"]["schema"]["enum"] == sorted(Action.values)
    assert parameters["via"]["schema"]["enum"] == sorted(Via.values)
    assert parameters["table"]["schema"]["enum"] == sorted(t.table for t in TRACKED)
    assert "enum" not in parameters["actor"]["schema"]
    for name in ("action", "via", "table"):
        for value in parameters[name]["schema"]["enum"]:
            assert finance.get("/api/v1/audit/entries", {name: value}).status_code == 200
        assert _field(finance.get("/api/v1/audit/entries", {name: "bogus"})) == name
    export = {p["name"]: p for p in schema["paths"]["/api/v1/audit/export"]["get"]["parameters"]}
    assert export["via"]["schema"]["enum"] == sorted(Via.values)


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/api/v1/audit/entries", "until"),
        ("/api/v1/audit/entries", "since"),
        ("/api/v1/audit/entries", "action"),
        ("/api/v1/audit/export", "until"),
        ("/api/v1/plan/forecasts", "run"),
        ("/api/v1/plan/forecasts", "pool"),
        ("/api/v1/plan/pools", "run"),
    ],
)
def test_a_parameter_sent_empty_is_a_400_naming_it(finance, path, name):
    answer = finance.get(path, {name: ""})
    assert _field(answer) == name
    assert "must not be empty" in answer.json()["error"]["message"]


def test_the_audit_page_still_reads_its_empty_filters_as_any(client):
    client.force_login(make_finance_user())
    page = client.get("/audit/", {"since": "", "until": "", "action": "", "via": ""})
    assert page.status_code == 200


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/margin-reports", {}),
        ("/api/v1/costs/runs", {}),
        ("/api/v1/costs/scenarios", {"name": "what if"}),
        ("/api/v1/costs/reopenings", {"reason": "late usage"}),
    ],
)
def test_end_equal_to_start_is_a_400_the_schema_states(finance, schema, path, body):
    moment = "2026-10-05T12:00:00Z"

    answer = finance.post(path, {**body, "start": moment, "end": moment}, format="json")

    assert _field(answer) == "end"
    operation = schema["paths"][path]["post"]
    ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    end = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]["end"]
    assert "equal to it: a 400 naming `end`" in end["description"]
    assert "400" in operation["responses"]


def test_ranged_queries_state_it_too(schema):
    usage = {p["name"]: p for p in schema["paths"]["/api/v1/usage"]["get"]["parameters"]}
    assert "equal to it: a 400 naming `end`" in usage["end"]["description"]
