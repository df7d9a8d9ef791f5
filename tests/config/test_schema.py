"""The OpenAPI schema generates, validates, and has no warnings."""

import pytest
import yaml
from django.core.management import call_command


def test_schema_generates_without_warnings(tmp_path):
    out = tmp_path / "schema.yml"
    # --fail-on-warn turns any warning into an error; --validate checks OpenAPI 3.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    schema = yaml.safe_load(out.read_text())
    assert {"/api/v1/tenants/me", "/api/v1/api-keys", "/api/v1/api-keys/{key_id}/revoke"} <= set(
        schema["paths"]
    )
    assert schema["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    create = schema["paths"]["/api/v1/api-keys"]["post"]
    assert {"201", "400", "401", "403"} <= set(create["responses"])


@pytest.mark.django_db
def test_docs_pages_are_served_offline(client, world_a):
    client.force_login(world_a.owner.user)
    assert client.get("/api/schema/").status_code == 200
    docs = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in docs
    assert "cdn" not in docs.lower()  # assets come from the sidecar package
