"""A real OpenID Connect provider for the tests (PyPI's oidc-provider-mock:
authlib's authorization server, RS256-signed ID tokens, discovery and JWKS),
served on loopback from a thread. Users and their claims are set through
its PUT /users/<sub>; a user is authorized on its form by their subject.

`audience` makes it a provider that issues its tokens for another client
than the one asking (a mix-up, or a token meant for another application):
the client id in the authorization and token requests is swapped on the way
in, so the code and the ID token belong to that other client."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import parse_qsl, urlencode

import httpx
import oidc_provider_mock
import werkzeug.serving

CLIENT_ID = "gpu-ledger-dashboard"
CLIENT_SECRET = "test-client-secret"


class _ClientIdSwap:
    """WSGI middleware: every client_id the provider receives becomes `to`."""

    def __init__(self, app, to: str) -> None:
        self.app, self.to = app, to

    def __call__(self, environ, start_response):
        query = parse_qsl(environ.get("QUERY_STRING", ""))
        if any(k == "client_id" for k, _ in query):
            environ["QUERY_STRING"] = urlencode(
                [(k, self.to if k == "client_id" else v) for k, v in query]
            )
        if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):
            length = int(environ.get("CONTENT_LENGTH") or 0)
            form = parse_qsl(environ["wsgi.input"].read(length).decode())
            body = urlencode([(k, self.to if k == "client_id" else v) for k, v in form]).encode()
            environ["wsgi.input"], environ["CONTENT_LENGTH"] = io.BytesIO(body), str(len(body))
        if environ.get("HTTP_AUTHORIZATION", "").startswith("Basic "):
            del environ["HTTP_AUTHORIZATION"]  # client_secret_basic names the client too
        return self.app(environ, start_response)


@dataclass
class OidcProvider:
    url: str

    def user_set(self, sub: str, **claims) -> None:
        """The claims the provider asserts for `sub` from now on."""
        httpx.put(f"{self.url}/users/{sub}", json=claims).raise_for_status()

    def settings_entry(self, *, provider_id: str = "corp", **mapping) -> dict:
        """This provider as an OIDC_PROVIDERS entry (config.sso)."""
        return {
            "id": provider_id,
            "name": "Corp SSO",
            "issuer": self.url,
            "client_id": CLIENT_ID,
            "client_secret": CLIENT_SECRET,
            "finance_groups": ["gpu-ledger-finance"],
            "tenants": ["*"],  # every tenant (tests/tenants/test_sso.py limits one)
            **mapping,
        }


@contextmanager
def oidc_provider_running(
    *, token_lifetime: timedelta = timedelta(hours=1), audience: str | None = None
) -> Iterator[OidcProvider]:
    app = oidc_provider_mock.app(access_token_max_age=token_lifetime)
    wsgi = _ClientIdSwap(app, audience) if audience else app
    server = werkzeug.serving.make_server("127.0.0.1", 0, wsgi, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield OidcProvider(url=f"http://127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
        thread.join(5)
        server.server_close()


def sso_settings(settings, provider: OidcProvider, **mapping) -> None:
    """Point the running Django's single sign-on at `provider`."""
    sso_settings_entries(settings, [provider.settings_entry(**mapping)])


def sso_settings_entries(settings, entries: list[dict]) -> None:
    """Single sign-on through these OIDC_PROVIDERS entries, as the
    operator's environment would configure them (config.sso parses them)."""
    from config.sso import allauth_providers, oidc_providers_parse

    def problem(line):
        raise AssertionError(line)

    settings.OIDC_PROVIDERS = oidc_providers_parse(json.dumps(entries), problem=problem)
    settings.SOCIALACCOUNT_PROVIDERS = allauth_providers(settings.OIDC_PROVIDERS)
