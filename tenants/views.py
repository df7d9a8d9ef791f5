"""Server-rendered pages: home, choosing which tenant to act for, and the
tenant's API keys."""

import time
from datetime import UTC, date, datetime

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from tenants.access import principal_for_session
from tenants.choices import Scope
from tenants.models import ApiKey
from tenants.selectors import api_key_list, membership_list_for_user, tenant_list_for_finance
from tenants.services import api_key_create, api_key_revoke


@login_required
def home(request):
    principal = principal_for_session(request)
    context = {
        "memberships": membership_list_for_user(user=request.user),
        "tenants": tenant_list_for_finance() if principal.is_finance else None,
    }
    return render(request, "tenants/home.html", context)


@login_required
@require_POST
def tenant_switch(request):
    slug = request.POST.get("tenant", "")
    if membership_list_for_user(user=request.user).filter(tenant__slug=slug).exists():
        request.session["tenant_slug"] = slug
    return redirect("home")


# A created key's secret waits in the session for the page the POST
# redirects to, which shows it once and drops it; never longer than this.
NEW_SECRET_SESSION_KEY = "api_key_new_secret"  # noqa: S105 (a session key name)
NEW_SECRET_SHOWN_WITHIN_SECONDS = 600


@login_required
def keys(request):
    """The tenant's API keys; owners and admins create and revoke them. A
    create redirects (303) to this page, which shows the new secret once:
    a refresh neither shows it again nor creates another key."""
    principal = principal_for_session(request)
    if principal is None or principal.tenant is None:
        raise PermissionDenied
    tenant, new_secret, errors = principal.tenant, None, {}
    if request.method == "POST":
        if not principal.can_manage_keys:
            raise PermissionDenied
        try:
            _, secret = api_key_create(
                tenant=tenant,
                name=request.POST.get("name", ""),
                scopes=request.POST.getlist("scopes"),
                expires_at=_expiry_parse(request.POST.get("expires_at", "")),
                created_by=request.user,
            )
        except ValidationError as exc:
            errors = exc.message_dict
        else:
            request.session[NEW_SECRET_SESSION_KEY] = {
                "secret": secret,
                "tenant_id": tenant.pk,
                "created": time.time(),
            }
            return HttpResponseRedirect(reverse("keys"), status=303)
    else:
        new = request.session.pop(NEW_SECRET_SESSION_KEY, None)
        if (
            new
            and new.get("tenant_id") == tenant.pk
            and time.time() - new.get("created", 0) < NEW_SECRET_SHOWN_WITHIN_SECONDS
        ):
            new_secret = new["secret"]
    context = {
        "keys": api_key_list(tenant=tenant),
        "scopes": Scope.choices,
        "new_secret": new_secret,
        "errors": errors,
        "form": request.POST if errors else {},
        "can_manage": principal.can_manage_keys,
        "now": timezone.now(),
    }
    response = render(request, "tenants/keys.html", context, status=400 if errors else 200)
    if new_secret:
        response["Cache-Control"] = "no-store"  # not kept by the browser's history either
    return response


def _expiry_parse(text: str) -> datetime | None:
    """The form's optional expiry day (YYYY-MM-DD) as that day's 00:00 UTC."""
    text = text.strip()
    if not text:
        return None
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise ValidationError({"expires_at": ["a day as YYYY-MM-DD is needed"]}) from None
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


@login_required
@require_POST
def key_revoke(request, key_id: int):
    principal = principal_for_session(request)
    if principal is None or principal.tenant is None or not principal.can_manage_keys:
        raise PermissionDenied
    try:
        key = api_key_revoke(tenant=principal.tenant, key_id=key_id, revoked_by=request.user)
    except ApiKey.DoesNotExist:
        raise Http404("no such key") from None
    messages.success(request, f"Key {key.display_prefix} revoked.")
    return redirect("keys")
