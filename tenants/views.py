"""Server-rendered pages: home, and choosing which tenant to act for."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from tenants.access import principal_for_session
from tenants.selectors import membership_list_for_user, tenant_list_for_finance


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
