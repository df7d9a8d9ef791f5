"""Price book versions, plans and subscriptions, written through their
services (billing.pricing.catalog, .plans) with the checks the pages and
the API make: a version in force and its prices, a plan in use and a
subscription started are read-only, and a POST changing one is refused
with the service's message."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.contrib.admin import widgets as admin_widgets
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from billing.admin.common import VersionedAdmin, service_refusal
from billing.errors import (
    PlanInUseError,
    PriceVersionInForceError,
    SubscriptionStartedError,
)
from billing.models import (
    ModelPrice,
    Plan,
    PriceBook,
    Subscription,
    VolumeTier,
)
from billing.pricing import catalog
from billing.pricing.catalog import (
    price_book_version_create,
    price_book_version_update,
    price_book_version_withdraw,
)
from billing.pricing.catalog_selectors import price_book_as_next, price_book_get
from billing.pricing.plans import (
    PLAN_FIELDS,
    plan_create,
    plan_update,
    subscription_move,
    subscription_withdraw,
)
from core.errors import ConflictError
from core.plain_decimal import PLAIN_DECIMALS


def _book_frozen(book: PriceBook | None) -> ConflictError | None:
    if book is not None and book.pk is not None and book.in_force_or_past():
        return PriceVersionInForceError(book)
    return None


class _BookInline(admin.TabularInline):
    """Prices (or a price's tiers) of a version: read-only once in force."""

    formfield_overrides = PLAIN_DECIMALS
    extra = 0

    def book_of(self, obj) -> PriceBook | None:
        return obj

    def _open(self, obj) -> bool:
        return _book_frozen(self.book_of(obj)) is None

    def has_add_permission(self, request, obj=None):
        return self._open(obj) and super().has_add_permission(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._open(obj) and super().has_change_permission(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._open(obj) and super().has_delete_permission(request, obj)


class ModelPriceInline(_BookInline):
    model = ModelPrice


class PriceBookForm(forms.ModelForm):
    class Meta:
        model = PriceBook
        fields = [
            "name",
            "version",
            "tier",
            "currency",
            "effective_from",
            "reservation_per_gpu_hour",
            "dedicated_per_gpu_month",
        ]

    def clean(self):
        cleaned = super().clean()
        if self.errors:
            return cleaned
        if self.instance.pk is None:
            service_refusal(self, lambda: price_book_version_create(**cleaned))
        else:
            changes = {f: cleaned[f] for f in catalog.EDITABLE if f in cleaned}
            service_refusal(self, lambda: price_book_version_update(book=self.instance, **changes))
        return cleaned


@admin.register(PriceBook)
class PriceBookAdmin(VersionedAdmin):
    """Versions are written through billing.pricing.catalog: a new one
    closes the version it supersedes; one in force (and its prices) is
    read-only, and "New version from a date" copies it."""

    formfield_overrides = PLAIN_DECIMALS
    form = PriceBookForm
    list_display = ["name", "version", "tier", "currency", "effective_from", "effective_to"]
    list_filter = ["name", "tier"]
    inlines = [ModelPriceInline]

    def frozen(self, obj):
        return _book_frozen(obj)

    def frozen_note(self, obj, refusal):
        link = reverse("admin:billing_pricebook_new_version", args=[obj.pk])
        return format_html(
            'Read-only: {} <a href="{}">New version from a date</a>', str(refusal), link
        )

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:  # a scheduled version keeps its name, number, tier and currency
            fields += [f for f in ("name", "version", "tier", "currency") if f not in fields]
        return fields + (["effective_to"] if "effective_to" not in fields else [])

    def save_model(self, request, obj, form, change):
        cleaned = form.cleaned_data
        if change:
            changes = {f: cleaned[f] for f in catalog.EDITABLE if f in cleaned}
            price_book_version_update(book=obj, **changes)
        else:
            obj.pk = price_book_version_create(**cleaned).pk
            obj.refresh_from_db()

    def delete_model(self, request, obj):
        price_book_version_withdraw(book=obj)

    def has_delete_permission(self, request, obj=None):
        return (obj is None or not obj.in_force_or_past()) and super().has_delete_permission(
            request, obj
        )

    def get_urls(self):
        new_version = self.admin_site.admin_view(self.new_version_view)
        return [
            path("<int:pk>/new-version/", new_version, name="billing_pricebook_new_version"),
            *super().get_urls(),
        ]

    def new_version_view(self, request, pk: int):
        """A copy of version `pk`, prices and tiers included, from a date."""
        if not self.has_add_permission(request):
            raise PermissionDenied
        book = price_book_get(book_id=pk)
        form = NewVersionForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            draft = price_book_as_next(book) | {
                "effective_from": form.cleaned_data["effective_from"]
            }
            service_refusal(form, lambda: price_book_version_create(**draft))
            if form.is_valid():
                created = price_book_version_create(**draft)
                self.message_user(
                    request, f"{created} from {created.effective_from:%Y-%m-%d %H:%M} UTC added."
                )
                return HttpResponseRedirect(
                    reverse("admin:billing_pricebook_change", args=[created.pk])
                )
        context = {
            **self.admin_site.each_context(request),
            "title": f"New version of {book.name} from a date",
            "book": book,
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/billing/pricebook/new_version.html", context)


class NewVersionForm(forms.Form):
    effective_from = forms.SplitDateTimeField(
        widget=admin_widgets.AdminSplitDateTime,
        help_text="UTC, on a whole hour: from the current hour on, never into an invoiced period.",
    )


class VolumeTierInline(_BookInline):
    model = VolumeTier

    def book_of(self, obj):
        return None if obj is None else obj.book


class ModelPriceForm(forms.ModelForm):
    class Meta:
        model = ModelPrice
        fields = [
            "book",
            "served_model",
            "input_per_mtok",
            "cached_input_per_mtok",
            "output_per_mtok",
            "per_gpu_second",
        ]

    def clean_book(self):
        book = self.cleaned_data["book"]
        refusal = _book_frozen(book)
        if refusal is not None:
            raise forms.ValidationError(str(refusal))
        return book


@admin.register(ModelPrice)
class ModelPriceAdmin(VersionedAdmin):
    formfield_overrides = PLAIN_DECIMALS
    form = ModelPriceForm
    list_display = [
        "book",
        "served_model",
        "input_per_mtok",
        "cached_input_per_mtok",
        "output_per_mtok",
        "per_gpu_second",
    ]
    list_filter = ["book"]
    inlines = [VolumeTierInline]

    def frozen(self, obj):
        return _book_frozen(obj.book)

    def has_delete_permission(self, request, obj=None):
        return (obj is None or _book_frozen(obj.book) is None) and super().has_delete_permission(
            request, obj
        )


class PlanForm(forms.ModelForm):
    class Meta:
        model = Plan
        fields = list(PLAN_FIELDS)

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            terms = {f: cleaned.get(f) for f in PLAN_FIELDS}
            if self.instance.pk is None:
                service_refusal(self, lambda: plan_create(**terms))
            else:
                service_refusal(self, lambda: plan_update(plan=self.instance, **terms))
        return cleaned


@admin.register(Plan)
class PlanAdmin(VersionedAdmin):
    """A plan a started subscription uses is read-only: new terms are a
    new plan, and subscriptions move to it from a date."""

    formfield_overrides = PLAIN_DECIMALS
    form = PlanForm
    list_display = ["name", "currency", "minimum_commit", "discount_percent"]

    def frozen(self, obj):
        return PlanInUseError(obj) if obj.started_subscriptions().exists() else None

    def save_model(self, request, obj, form, change):
        terms = {f: form.cleaned_data.get(f) for f in PLAN_FIELDS}
        if change:
            plan_update(plan=obj, **terms)
        else:
            obj.pk = plan_create(**terms).pk

    def has_delete_permission(self, request, obj=None):
        return (
            obj is None or not obj.started_subscriptions().exists()
        ) and super().has_delete_permission(request, obj)


class SubscriptionForm(forms.ModelForm):
    class Meta:
        model = Subscription
        fields = ["tenant", "plan", "issuer", "anchor_day", "start"]
        labels = {"start": "From"}
        help_texts = {
            "start": "A move: the subscription in force then ends there (UTC, whole hour)."
        }

    def clean(self):
        cleaned = super().clean()
        if not self.errors and self.instance.pk is None:
            service_refusal(self, lambda: _subscription_move(cleaned))
        return cleaned


def _subscription_move(cleaned: dict) -> Subscription:
    return subscription_move(
        tenant=cleaned["tenant"],
        plan=cleaned["plan"],
        effective_from=cleaned["start"],
        anchor_day=cleaned.get("anchor_day"),
        issuer=cleaned.get("issuer"),
    )


@admin.register(Subscription)
class SubscriptionAdmin(VersionedAdmin):
    """Added as a move (billing.pricing.plans.subscription_move: the one
    in force ends where it starts); one started is read-only."""

    form = SubscriptionForm
    list_display = ["tenant", "plan", "anchor_day", "start", "end"]
    list_filter = ["plan"]

    def frozen(self, obj):
        return SubscriptionStartedError(obj) if obj.start <= timezone.now() else None

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:
            fields += [f for f in ("tenant", "start", "end") if f not in fields]
        return fields

    def save_model(self, request, obj, form, change):
        if change:
            super().save_model(request, obj, form, change)  # scheduled: the model allows it
        else:
            obj.pk = _subscription_move(form.cleaned_data).pk

    def delete_model(self, request, obj):
        subscription_withdraw(subscription=obj)

    def has_delete_permission(self, request, obj=None):
        return (obj is None or obj.start > timezone.now()) and super().has_delete_permission(
            request, obj
        )
