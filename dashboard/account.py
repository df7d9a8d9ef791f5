"""The account pages: home, choosing which tenant to act for, and the
tenant's API keys."""

import time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied, ValidationError
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from dashboard.forms import ApiKeyCreateForm, TenantSwitchForm
from tenants.access import principal_for_session
from tenants.choices import Scope
from tenants.selectors import (
    api_key_list,
    membership_list_for_user,
    tenant_list_for_finance,
    user_is_member,
)
from tenants.services import api_key_create, api_key_revoke


@login_required
def home(request):
    principal = principal_for_session(request)
    context = {
        "memberships": membership_list_for_user(user=request.user),
        "tenants": tenant_list_for_finance() if principal.is_finance else None,
    }
    return render(request, "dashboard/home.html", context)


@login_required
@require_POST
def tenant_switch(request):
    form = TenantSwitchForm(request.POST)
    slug = form.cleaned_data["tenant"] if form.is_valid() else ""
    if user_is_member(user=request.user, tenant_slug=slug):
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
        form = ApiKeyCreateForm(request.POST)
        if form.is_valid():
            try:
                _, secret = api_key_create(
                    tenant=tenant, created_by=request.user, **form.cleaned_data
                )
            except ValidationError as exc:
                form.add_error(None, exc)  # the service's rules, shown by field
            else:
                request.session[NEW_SECRET_SESSION_KEY] = {
                    "secret": secret,
                    "tenant_id": tenant.pk,
                    "created": time.time(),
                }
                return HttpResponseRedirect(reverse("keys"), status=303)
        errors = {field: list(messages) for field, messages in form.errors.items()}
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
    response = render(request, "dashboard/keys.html", context, status=400 if errors else 200)
    if new_secret:
        response["Cache-Control"] = "no-store"  # not kept by the browser's history either
    return response


@login_required
@require_POST
def key_revoke(request, key_id: int):
    principal = principal_for_session(request)
    if principal is None or principal.tenant is None or not principal.can_manage_keys:
        raise PermissionDenied
    try:
        key = api_key_revoke(tenant=principal.tenant, key_id=key_id, revoked_by=request.user)
    except ObjectDoesNotExist:  # another tenant's, or none
        raise Http404("no such key") from None
    messages.success(request, f"Key {key.display_prefix} revoked.")
    return redirect("keys")
