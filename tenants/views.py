"""Server-rendered pages: home, choosing which tenant to act for, and the
tenant's API keys."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404
from django.shortcuts import redirect, render
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


@login_required
def keys(request):
    """The tenant's API keys; owners and admins create (the secret is shown
    on this one response, never again) and revoke them."""
    principal = principal_for_session(request)
    if principal is None or principal.tenant is None:
        raise PermissionDenied
    tenant, new_secret, errors = principal.tenant, None, {}
    if request.method == "POST":
        if not principal.can_manage_keys:
            raise PermissionDenied
        scopes = request.POST.getlist("scopes")
        try:
            _, new_secret = api_key_create(
                tenant=tenant,
                name=request.POST.get("name", ""),
                scopes=scopes,
                created_by=request.user,
            )
        except ValidationError as exc:
            errors = exc.message_dict
    context = {
        "keys": api_key_list(tenant=tenant),
        "scopes": Scope.choices,
        "new_secret": new_secret,
        "errors": errors,
        "can_manage": principal.can_manage_keys,
    }
    return render(request, "tenants/keys.html", context, status=400 if errors else 200)


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
