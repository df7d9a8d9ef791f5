"""What a provider's claims grant here. Pure: the adapter resolves the
tenants and writes the result (tenants.services.user_access_sync).

- A group named in the provider's `finance_groups`, in its groups claim,
  makes the user platform finance staff.
- Its tenant claim (a tenant's slug, or a list of them) with its role claim
  (owner, admin or viewer; viewer when absent) makes a membership, of the
  tenants the provider's `tenants` lists only (["*"]: every one); one it
  may not grant is left out and logged.
A user granted neither is refused, and nothing is created for them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tenants.choices import Role


class SignInRefused(Exception):
    """The claims grant nothing here; the message says why, for the user
    and for the log."""


@dataclass(frozen=True)
class Grants:
    finance: bool
    role: str
    tenant_slugs: tuple[str, ...]
    # Tenants the claims named that this provider may not grant (logged).
    refused_slugs: tuple[str, ...] = ()


def _strings(value: Any, *, claim: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(v for v in value if v)
    raise SignInRefused(f"claim {claim!r} must be a string or a list of strings, not {value!r}")


def grants_from_claims(claims: Mapping[str, Any], *, mapping: Mapping[str, Any]) -> Grants:
    """The grants in `claims` under a provider's `mapping` (its
    finance_groups and claim names, config.sso)."""
    groups = set(_strings(claims.get(mapping["groups_claim"]), claim=mapping["groups_claim"]))
    finance = bool(groups & set(mapping["finance_groups"]))
    slugs = _strings(claims.get(mapping["tenant_claim"]), claim=mapping["tenant_claim"])
    role = claims.get(mapping["role_claim"]) or Role.VIEWER
    if slugs and role not in Role.values:
        raise SignInRefused(
            f"claim {mapping['role_claim']!r} is {role!r}; it must be one of "
            f"{', '.join(Role.values)}"
        )
    allowed = set(mapping.get("tenants") or ())
    refused = () if "*" in allowed else tuple(s for s in slugs if s not in allowed)
    slugs = tuple(s for s in slugs if s not in refused)
    if not finance and not slugs:
        if refused:
            raise SignInRefused(
                f"your identity provider may not grant access to {', '.join(refused)} "
                f"(claim {mapping['tenant_claim']!r}): the operator lists the tenants each "
                "provider speaks for"
            )
        raise SignInRefused(
            f"your identity provider named no tenant (claim {mapping['tenant_claim']!r}) "
            f"and no finance group (claim {mapping['groups_claim']!r}) for you"
        )
    return Grants(finance=finance, role=str(role), tenant_slugs=slugs, refused_slugs=refused)
