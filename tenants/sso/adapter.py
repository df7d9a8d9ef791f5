"""django-allauth's hooks for single sign-on: claims become this product's
roles on every sign-in; a sign-in that grants nothing, or whose tokens or
state fail allauth's checks, is refused with a page and a log line saying
why. allauth checks the ID token's issuer, audience (our client id) and
expiry, and the state against the session (its OAuth2CallbackView)."""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import jwt
from allauth.account.adapter import DefaultAccountAdapter
from allauth.core.exceptions import ImmediateHttpResponse
from allauth.socialaccount.adapter import DefaultSocialAccountAdapter
from django.db import transaction
from django.http import HttpRequest
from django.shortcuts import render

from tenants.selectors import tenant_list_by_slugs
from tenants.services import user_access_sync
from tenants.sso.claims import Grants, SignInRefused, grants_from_claims

logger = logging.getLogger("tenants.sso")


class NoSignupAccountAdapter(DefaultAccountAdapter):
    """No one signs themselves up: accounts come from the identity provider
    (claims checked first) or from the operator."""

    def is_open_for_signup(self, request: HttpRequest) -> bool:
        return False


class ClaimsAdapter(DefaultSocialAccountAdapter):
    def is_open_for_signup(self, request, sociallogin) -> bool:
        return True  # pre_social_login has already refused anyone the claims grant nothing

    def is_auto_signup_allowed(self, request, sociallogin) -> bool:
        return True

    def pre_social_login(self, request, sociallogin) -> None:
        account = sociallogin.account
        provider = account.get_provider()
        claims = {
            **account.extra_data.get("id_token", {}),
            **account.extra_data.get("userinfo", {}),
        }
        subject = f"{account.provider}:{account.uid}"
        try:
            grants = grants_from_claims(claims, mapping=provider.app.settings["claims"])
            if grants.refused_slugs:
                logger.warning(
                    "single sign-on for %s: provider %s may not grant %s; left out",
                    subject,
                    account.provider,
                    ", ".join(grants.refused_slugs),
                )
            roles = self._roles(grants, claims_name=provider.app.settings["claims"]["tenant_claim"])
        except SignInRefused as refusal:
            logger.warning("single sign-on refused for %s: %s", subject, refusal)
            raise ImmediateHttpResponse(_refusal_page(request, str(refusal), status=403)) from None
        sociallogin.state["grants"] = {"finance": grants.finance, "roles": roles}
        if sociallogin.is_existing:
            self._sync(request, sociallogin)

    def save_user(self, request, sociallogin, form=None):
        with transaction.atomic():
            with self.acting(request, sociallogin):  # the user, not saved yet
                user = super().save_user(request, sociallogin, form)
            self._sync(request, sociallogin)
        return user

    def acting(self, request: HttpRequest, sociallogin) -> AbstractContextManager:
        """Around the writes a sign-in makes (the user, their standing):
        what they are recorded as. The audit trail's subclass names the
        identity provider's subject (audit.sso)."""
        return nullcontext()

    def on_authentication_error(
        self, request, provider, error=None, exception=None, extra_context=None
    ) -> None:
        reason = authentication_error_reason(error, exception, extra_context or {})
        logger.warning(
            "single sign-on failed with provider %s (client %s): %s",
            provider.sub_id,
            provider.app.client_id,
            reason,
        )
        raise ImmediateHttpResponse(_refusal_page(request, reason, status=400))

    @staticmethod
    def _roles(grants: Grants, *, claims_name: str) -> dict[str, str]:
        tenants = tenant_list_by_slugs(slugs=grants.tenant_slugs)
        unknown = sorted(set(grants.tenant_slugs) - {t.slug for t in tenants})
        if unknown:
            if not tenants and not grants.finance:
                raise SignInRefused(
                    f"no tenant here is named {', '.join(unknown)} (claim {claims_name!r})"
                )
            logger.warning(
                "single sign-on: claim %r names unknown tenants %s", claims_name, unknown
            )
        return {t.slug: grants.role for t in tenants}

    def _sync(self, request: HttpRequest, sociallogin) -> None:
        grants = sociallogin.state["grants"]
        roles = {t: grants["roles"][t.slug] for t in tenant_list_by_slugs(slugs=grants["roles"])}
        with self.acting(request, sociallogin):
            notes = user_access_sync(user=sociallogin.user, finance=grants["finance"], roles=roles)
        account = sociallogin.account
        for note in notes:
            logger.warning("single sign-on for %s:%s: %s", account.provider, account.uid, note)


def authentication_error_reason(error: Any, exception: Any, context: dict) -> str:
    """One line naming why allauth refused a sign-in."""
    if "state_id" in context and "state" not in context:
        return (
            f"state mismatch: no sign-in was started with state {context['state_id']!r} "
            "in this browser session"
        )
    cause = exception
    while cause is not None:
        if isinstance(cause, jwt.ExpiredSignatureError):
            return "the ID token has expired"
        if isinstance(cause, jwt.InvalidAudienceError):
            return "the ID token is for another audience (not this client id)"
        if isinstance(cause, jwt.InvalidIssuerError):
            return "the ID token comes from another issuer"
        if isinstance(cause, jwt.PyJWTError):
            return f"the ID token is invalid: {cause}"
        cause = cause.__cause__ or cause.__context__
    if exception is not None:
        return f"{type(exception).__name__}: {exception}"
    return f"the provider answered with an error ({error})"


def _refusal_page(request: HttpRequest, reason: str, *, status: int):
    return render(request, "registration/sso_refused.html", {"reason": reason}, status=status)
