"""Single sign-on's writes in the audit trail: a sign-in makes the user and
their standing (finance staff, memberships) what the identity provider's
claims say before anyone is signed in, so those changes are recorded as
the provider's subject on behalf of that user, not as an anonymous
request (settings.SOCIALACCOUNT_ADAPTER names this adapter)."""

from __future__ import annotations

from django.http import HttpRequest

from audit.choices import Via
from audit.context import Actor, acting_as
from tenants.sso.adapter import ClaimsAdapter


class AuditedClaimsAdapter(ClaimsAdapter):
    def acting(self, request: HttpRequest, sociallogin):
        account = sociallogin.account
        return acting_as(
            Actor(
                name=f"sso:{account.provider}:{account.uid}",
                via=Via.SSO,
                user_id=sociallogin.user.pk,  # None while the user is being created
                request=f"{request.method} {request.path}",
            )
        )
