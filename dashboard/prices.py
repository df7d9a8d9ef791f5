"""Finance's prices pages (finance staff only; the admin stays for
operators):

- /finance/prices/: every price book with its versions and their status
  (scheduled, in force, superseded, ended), the plans with a form for a
  new one, and every tenant's subscriptions in force or scheduled;
- /finance/prices/<id>/: a version's prices and volume tiers, a form for
  a new version from a date (starting from a copy of this one's prices),
  and, while it is scheduled, withdrawing it;
- /finance/tenants/<slug>/terms/: a tenant's subscriptions, moving it to a
  plan from a date, and its policy (gateway limits and budget).

Every write goes through the services the API and the admin use
(billing.pricing.catalog, .plans, tenants.policies): a version in force is
never edited, a change dated before the current hour or into an invoiced
period is refused naming effective_from, amounts are read by the one
parser. A refused form is shown with "field: message", nothing written,
and a 400 (409 for a conflict); the audit trail records who wrote."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import ObjectDoesNotExist
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render

from billing.errors import TermsDatedError
from billing.pricing.catalog import (
    FEES,
    TOKEN_PRICES,
    price_book_version_create,
    price_book_version_withdraw,
)
from billing.pricing.catalog_selectors import (
    plan_get,
    plan_list,
    price_book_as_next,
    price_book_get,
    price_book_list,
    served_model_by_name,
    subscription_list,
    subscription_list_all,
)
from billing.pricing.plans import plan_create, subscription_move
from billing.spend.budgets import budget_check
from core.errors import ConflictError, InputError
from core.forms import UtcDayField
from tenants.access import finance_staff_required
from tenants.policies import POLICY_FIELDS, tenant_policy_update
from tenants.selectors import tenant_for_finance, tenant_list_for_finance

PRICE_FIELDS = (*TOKEN_PRICES, "per_gpu_second")


def _error(error: Exception) -> dict:
    """A refusal as the page shows it, with its HTTP status."""
    if isinstance(error, TermsDatedError):
        return {
            "field": error.field,
            "message": str(error).removeprefix(f"{error.field}: "),
            "status": 409,
        }
    if isinstance(error, InputError):
        return {"field": error.field, "message": error.message, "status": 400}
    return {"field": "", "message": str(error), "status": 409}


def _moment(post, *, day_field: str = "effective_day", hour_field: str = "effective_hour"):
    """The day (YYYY-MM-DD, UTC) and whole hour typed, as one moment."""
    try:
        day = UtcDayField().clean(post.get(day_field, ""))
    except forms.ValidationError as error:
        raise InputError("effective_from", " ".join(error.messages)) from None
    text = (post.get(hour_field) or "0").strip()
    if not text.isdigit() or not 0 <= int(text) <= 23:
        raise InputError("effective_from", "the hour is a whole hour from 0 to 23 (UTC)")
    return day.replace(hour=int(text))


@finance_staff_required
def prices_page(request):
    errors: dict = {}
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "plan":
                plan = plan_create(
                    name=request.POST.get("name", ""),
                    currency=request.POST.get("currency", "").strip().upper(),
                    minimum_commit=request.POST.get("minimum_commit") or "0",
                    discount_percent=request.POST.get("discount_percent") or "0",
                    prepaid=request.POST.get("prepaid") == "on",
                )
                messages.success(request, f"Plan {plan.name} added.")
            else:
                raise InputError("action", "plan")
        except (InputError, ConflictError) as error:
            errors = _error(error) | {"action": action}
        else:
            return redirect("prices")
    context = {
        "books": _by_name(price_book_list()),
        "plans": plan_list(),
        "subscriptions": subscription_list_all(),
        "errors": errors,
        "form": request.POST if errors else {},
    }
    return render(request, "dashboard/prices.html", context, status=errors.get("status", 200))


def _by_name(books) -> list[dict]:
    names: dict[str, list] = {}
    for book in books:
        names.setdefault(book.name, []).append(book)
    return [{"name": name, "versions": versions} for name, versions in names.items()]


@finance_staff_required
def price_book_page(request, pk: int):
    try:
        book = price_book_get(book_id=pk)
    except ObjectDoesNotExist:
        raise Http404("no such price book version") from None
    errors: dict = {}
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "new_version":
                created = price_book_version_create(**_new_version(request.POST, book))
                messages.success(
                    request,
                    f"{created.name} v{created.version} takes effect "
                    f"{created.effective_from:%Y-%m-%d %H:%M} UTC.",
                )
                return redirect("price-book", pk=created.pk)
            if action == "withdraw":
                price_book_version_withdraw(book=book)
                messages.success(request, f"{book.name} v{book.version} withdrawn.")
                return redirect("prices")
            raise InputError("action", "new_version or withdraw")
        except (InputError, ConflictError) as error:
            errors = _error(error) | {"action": action}
    context = {
        "book": book,
        "errors": errors,
        "form": request.POST if errors else {},
        **_new_version_fields(book, request.POST if errors else None),
    }
    return render(request, "dashboard/price_book.html", context, status=errors.get("status", 200))


FEE_LABELS = {
    "reservation_per_gpu_hour": "Reserved, per GPU-hour",
    "dedicated_per_gpu_month": "Dedicated, per GPU-month",
}


def _new_version_fields(book, typed) -> dict:
    """The new-version form's inputs: as typed when refused, else a copy of
    `book`'s fees and prices."""
    draft = price_book_as_next(book)

    def value(name: str, copied) -> str:
        if typed is not None:
            return typed.get(name, "")
        return "" if copied is None else f"{copied.normalize():f}"

    return {
        "fee_fields": [(f, FEE_LABELS[f], value(f, draft[f])) for f in FEES],
        "rows": [
            {
                "model": price["served_model"].name,
                "fields": [
                    (f"prices.{n}.{f}", value(f"prices.{n}.{f}", price[f])) for f in PRICE_FIELDS
                ],
            }
            for n, price in enumerate(draft["prices"])
        ],
    }


def _new_version(post, book) -> dict:
    """A new version of `book` from the form: its fees and each model's
    prices as typed (a copy of `book`'s to start with), its tiers copied."""
    draft = price_book_as_next(book)
    prices = []
    for n, price in enumerate(draft["prices"]):
        model = served_model_by_name(name=post.get(f"prices.{n}.served_model", ""))
        if model is None:
            raise InputError(f"prices.{n}.served_model", "a served model is needed")
        typed = {f: post.get(f"prices.{n}.{f}", "").strip() for f in PRICE_FIELDS}
        prices.append(price | {"served_model": model} | typed)
    return draft | {
        "prices": prices,
        "effective_from": _moment(post),
        **{f: post.get(f, "").strip() for f in FEES},
    }


@finance_staff_required
def tenant_terms_page(request, slug: str):
    try:
        tenant = tenant_for_finance(slug=slug)
    except ObjectDoesNotExist:
        raise Http404("no such tenant") from None
    errors: dict = {}
    if request.method == "POST":
        action = request.POST.get("action", "")
        try:
            if action == "move":
                subscription = subscription_move(
                    tenant=tenant, plan=_plan(request.POST), effective_from=_moment(request.POST)
                )
                messages.success(
                    request,
                    f"{tenant.slug} moves to {subscription.plan.name} from "
                    f"{subscription.start:%Y-%m-%d %H:%M} UTC.",
                )
            elif action == "policy":
                changes = {
                    f: (request.POST[f].strip() or None) for f in POLICY_FIELDS if f in request.POST
                }
                with transaction.atomic():  # the policy and the budget block it implies
                    tenant_policy_update(tenant=tenant, **changes)
                    budget_check(tenant=tenant)
                messages.success(request, f"Policy of {tenant.slug} saved.")
            else:
                raise InputError("action", "move or policy")
        except (InputError, ConflictError) as error:
            errors = _error(error) | {"action": action}
        else:
            return redirect("tenant-terms", slug=tenant.slug)
    policy = tenant.policy
    context = {
        "tenant": tenant,
        "subscriptions": subscription_list(tenant=tenant),
        "plans": plan_list(),
        "policy_fields": [
            (f, request.POST.get(f, "") if errors else _shown(getattr(policy, f)))
            for f in POLICY_FIELDS
        ],
        "errors": errors,
        "form": request.POST if errors else {},
        "tenants": tenant_list_for_finance(),
    }
    return render(request, "dashboard/tenant_terms.html", context, status=errors.get("status", 200))


def _plan(post):
    try:
        return plan_get(plan_id=int(post.get("plan", "")))
    except (ValueError, ObjectDoesNotExist):
        raise InputError("plan", "choose a plan") from None


def _shown(value) -> str:
    return "" if value is None else str(value)
