"""A Content-Security-Policy on every response (issue 60): a script or a
<style> element runs only from this site's own files or when it carries the
request's nonce, so markup slipped into a page (a tenant's name, an
invoice's text) cannot run script or restyle it, and no page can be framed.

Templates write `nonce="{{ request.csp_nonce }}"` on their inline elements;
they have no event handler or style attributes, which no nonce can allow.
Django 5.2 has no CSP of its own (6.0 does, with the same request.csp_nonce)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from django.conf import settings

HEADER = "Content-Security-Policy"


BASE = {
    "default-src": ["'self'"],
    "script-src": ["'self'", "'nonce-{nonce}'"],
    "style-src": ["'self'", "'nonce-{nonce}'"],
    "img-src": ["'self'", "data:"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "frame-ancestors": ["'none'"],
    "form-action": ["'self'"],
}


def csp_policy(
    *,
    nonce: str,
    form_targets: Sequence[str] = (),
    extra: Mapping[str, Sequence[str]] | None = None,
) -> str:
    """The policy of a response whose inline elements carry `nonce`.
    `form_targets`: origins besides this one that a form's submission may
    end up at (an identity provider the SSO button's POST redirects to).
    `extra`: sources a view adds to a directive (csp_allowing)."""
    directives = {name: [v.format(nonce=nonce) for v in values] for name, values in BASE.items()}
    directives["form-action"] += list(form_targets)
    for name, values in (extra or {}).items():
        kept = directives.setdefault(name, ["'self'"])
        if "'unsafe-inline'" in values:  # a browser ignores it beside a nonce
            kept[:] = [v for v in kept if not v.startswith("'nonce-")]
        kept.extend(values)
    return "; ".join(" ".join([name, *values]) for name, values in directives.items())


def csp_allowing(view: Callable, **sources: Sequence[str]) -> Callable:
    """`view` answered under the policy with `sources` added, by directive
    (style_src=["'unsafe-inline'"] adds to style-src): for a third party's
    page whose bundle does what no nonce reaches. Scripts stay nonce-only."""
    view.csp_extra = {name.replace("_", "-"): list(values) for name, values in sources.items()}
    return view


def sso_origins() -> list[str]:
    """The origins of the identity providers (settings.OIDC_PROVIDERS):
    the sign-in page's POST to a provider's button is answered with a
    redirect there, which form-action governs too."""
    origins = set()
    for provider in settings.OIDC_PROVIDERS:
        url = urlsplit(provider["issuer"])
        origins.add(f"{url.scheme}://{url.netloc}")
    return sorted(origins)


class ContentSecurityPolicyMiddleware:
    """A fresh nonce per request (request.csp_nonce) and the policy naming
    it on the response, unless the view set a policy of its own."""

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request):
        request.csp_nonce = secrets.token_urlsafe(16)
        request.csp_extra = None
        response = self.get_response(request)
        if HEADER in response:
            return response
        if settings.DEBUG and response.status_code in (404, 500):
            return response  # Django's debug pages: inline script and style of their own
        response[HEADER] = csp_policy(
            nonce=request.csp_nonce, form_targets=sso_origins(), extra=request.csp_extra
        )
        return response

    def process_view(self, request, view_func, view_args, view_kwargs):
        request.csp_extra = getattr(view_func, "csp_extra", None)
