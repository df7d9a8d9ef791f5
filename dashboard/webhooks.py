"""The webhooks page (/webhooks/): a tenant's owners and admins register
their endpoints and choose events, see deliveries and redeliver, and
choose the events they are emailed about; finance staff do the same for
the operator's endpoints, and see every tenant's deliveries."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.core.exceptions import ObjectDoesNotExist, PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_POST

from core.errors import InputError
from tenants.access import principal_for_session
from webhooks.choices import TENANT_EVENTS, EventType
from webhooks.selectors import (
    alerts_emailed,
    delivery_get,
    delivery_list,
    endpoint_get,
    endpoint_list,
)
from webhooks.services import (
    alert_opt_out_set,
    delivery_redeliver,
    endpoint_create,
    endpoint_delete,
    endpoint_update,
)

RECENT = 50


def _scope(request):
    """Whose webhooks: None, the operator's (finance staff); else the
    tenant of an owner or admin."""
    principal = principal_for_session(request)
    if principal.for_platform:
        return None
    if principal.tenant is None or not principal.can_manage_keys:
        raise PermissionDenied
    return principal.tenant


@login_required
def webhooks_page(request):
    tenant = _scope(request)
    errors, form = {}, {}
    if request.method == "POST":
        action = request.POST.get("action")
        try:
            if action == "create":
                form = request.POST
                endpoint_create(
                    tenant=tenant,
                    url=request.POST.get("url", "").strip(),
                    event_types=request.POST.getlist("event_types"),
                    description=request.POST.get("description", ""),
                    created_by=request.user,
                )
            elif action in {"enable", "disable", "delete"}:
                endpoint = endpoint_get(tenant=tenant, pk=int(request.POST.get("endpoint", 0)))
                if action == "delete":
                    endpoint_delete(endpoint=endpoint)
                else:
                    endpoint_update(endpoint=endpoint, active=action == "enable")
            elif action == "alerts" and tenant is not None:
                alert_opt_out_set(
                    user=request.user, tenant=tenant, emailed=request.POST.getlist("emailed")
                )
            else:
                errors["action"] = [f"unknown action {action!r}"]
        except InputError as error:
            errors[error.field] = [error.message]
        except (ObjectDoesNotExist, ValueError):
            raise Http404("no such endpoint") from None
        if not errors:
            return HttpResponseRedirect(reverse("webhooks"), status=303)
    context = {
        "tenant": tenant,
        "endpoints": endpoint_list(tenant=tenant),
        "deliveries": delivery_list(tenant=tenant)[:RECENT],
        "event_choices": [(t.value, t.label) for t in (TENANT_EVENTS if tenant else EventType)],
        "emailed": alerts_emailed(user=request.user, tenant=tenant) if tenant else None,
        "errors": errors,
        "form": form,
    }
    return render(request, "dashboard/webhooks.html", context, status=400 if errors else 200)


@login_required
def webhook_delivery_page(request, pk: int):
    tenant = _scope(request)
    try:
        delivery = delivery_get(tenant=tenant, pk=pk)
    except ObjectDoesNotExist:
        raise Http404("no such delivery") from None
    return render(request, "dashboard/webhook_delivery.html", {"delivery": delivery})


@login_required
@require_POST
def webhook_redeliver(request, pk: int):
    tenant = _scope(request)
    try:
        delivery = delivery_get(tenant=tenant, pk=pk)
    except ObjectDoesNotExist:
        raise Http404("no such delivery") from None
    delivery_redeliver(delivery=delivery, by=request.user.get_username())
    return HttpResponseRedirect(reverse("webhook-delivery", args=[pk]), status=303)
