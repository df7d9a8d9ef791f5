"""Single sign-on providers from settings: the operator's OpenID Connect
identity providers, read from one JSON list (OIDC_PROVIDERS) and turned into
django-allauth's settings-based apps. Each app's `settings` also carries how
its claims map to this product's roles (tenants.sso reads them there).

Nothing here imports an app: settings load before apps do."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, NoReturn

# The claims a provider's token or userinfo answer is read for, and their
# names unless the provider's entry says otherwise.
CLAIM_DEFAULTS = {"groups_claim": "groups", "tenant_claim": "tenant", "role_claim": "role"}
REQUIRED = ("id", "name", "issuer", "client_id", "client_secret")
# `tenants`: the tenants (slugs) whose memberships the provider may grant;
# ["*"] for every tenant. None by default: a provider names which tenants
# it speaks for, or its tenant claims grant nothing (issue 60, finding 9).
OPTIONAL = ("finance_groups", "tenants", *CLAIM_DEFAULTS)
# Whether claims are also read from the provider's userinfo endpoint (they
# are always read from the ID token); off for a provider whose ID token
# carries the groups and tenant claims and whose userinfo does not.
FLAGS = ("userinfo",)
PROVIDER_ID = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
EXAMPLE = (
    '[{"id": "corp", "name": "Corp SSO", "issuer": "https://idp.example.com", '
    '"client_id": "...", "client_secret": "...", "finance_groups": ["gpu-ledger-finance"]}]'
)


def oidc_providers_parse(raw: str, *, problem: Callable[[str], NoReturn]) -> list[dict[str, Any]]:
    """The providers in OIDC_PROVIDERS (a JSON list), checked; `problem`
    is called with one line naming the first thing wrong."""
    if not raw.strip():
        return []
    try:
        entries = json.loads(raw)
    except json.JSONDecodeError as error:
        problem(f"OIDC_PROVIDERS is not JSON ({error}); expected a list like {EXAMPLE}")
    if not isinstance(entries, list):
        problem(f"OIDC_PROVIDERS must be a JSON list like {EXAMPLE}")
    providers, seen = [], set()
    for index, entry in enumerate(entries):
        where = f"OIDC_PROVIDERS[{index}]"
        if not isinstance(entry, dict):
            problem(f"{where} must be an object like {EXAMPLE}")
        known = [*REQUIRED, *OPTIONAL, *FLAGS]
        unknown = sorted(set(entry) - set(known))
        if unknown:
            problem(f"{where} has unknown keys {unknown}; known: {known}")
        for key in REQUIRED:
            if not isinstance(entry.get(key), str) or not entry[key].strip():
                problem(f"{where}.{key} is required (a non-empty string)")
        if not PROVIDER_ID.match(entry["id"]):
            problem(f"{where}.id must be lowercase letters, digits, - or _ (it is in the URL)")
        if entry["id"] in seen:
            problem(f"{where}.id {entry['id']!r} is used twice")
        seen.add(entry["id"])
        if not entry["issuer"].startswith(("https://", "http://")):
            problem(f"{where}.issuer must be the provider's https:// URL")
        groups = entry.get("finance_groups", [])
        if not isinstance(groups, list) or not all(isinstance(g, str) for g in groups):
            problem(f"{where}.finance_groups must be a list of group names")
        tenants = entry.get("tenants", [])
        if not isinstance(tenants, list) or not all(isinstance(t, str) and t for t in tenants):
            problem(f'{where}.tenants must be a list of tenant slugs, or ["*"] for every tenant')
        for key in CLAIM_DEFAULTS:
            if key in entry and (not isinstance(entry[key], str) or not entry[key]):
                problem(f"{where}.{key} must be a claim name")
        if not isinstance(entry.get("userinfo", True), bool):
            problem(f"{where}.userinfo must be true or false")
        providers.append(
            {**CLAIM_DEFAULTS, "finance_groups": [], "tenants": [], "userinfo": True, **entry}
        )
    return providers


def allauth_providers(providers: list[dict[str, Any]]) -> dict[str, Any]:
    """django-allauth's SOCIALACCOUNT_PROVIDERS for these providers."""
    return {
        "openid_connect": {
            "OAUTH_PKCE_ENABLED": True,
            "APPS": [
                {
                    "provider_id": p["id"],
                    "name": p["name"],
                    "client_id": p["client_id"],
                    "secret": p["client_secret"],
                    "settings": {
                        "server_url": p["issuer"],
                        "fetch_userinfo": p["userinfo"],
                        "claims": {key: p[key] for key in OPTIONAL},
                    },
                }
                for p in providers
            ],
        }
    }
