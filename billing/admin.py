"""Finance staff's admin for costs and prices. Rates are written through
the rate service (overlaps refused, a change closes the rate it replaces;
a rate in effect is read-only); runs and results are read-only records.
Price book versions, plans and subscriptions are written through their
services (billing.pricing.catalog, .plans) with the checks the pages and
the API make: a version in force and its prices, a plan in use and a
subscription started are read-only, and a POST changing one is refused
with the service's message."""

import copy

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets as admin_widgets
from django.core.exceptions import PermissionDenied
from django.db import connection, transaction
from django.forms.models import construct_instance
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html

from billing.costs.closing import cost_period_reopen, cost_period_reopen_check
from billing.costs.rates import EDITABLE, cost_rate_check, cost_rate_create, cost_rate_update
from billing.errors import (
    BillingInputError,
    CostPeriodClosedError,
    PlanInUseError,
    PriceVersionInForceError,
    SubscriptionStartedError,
    TermsDatedError,
)
from billing.models import (
    AllocationRun,
    BudgetState,
    CostAllocation,
    CostPeriodReopening,
    CostRate,
    CostScenario,
    CreditGrant,
    CreditNote,
    FxRate,
    Invoice,
    InvoiceLine,
    InvoiceRun,
    Issuer,
    MarginReport,
    ModelPrice,
    Plan,
    PoolHourCost,
    PriceBook,
    SlaCreditAdjustment,
    SlaCreditRule,
    SloPolicy,
    StripeCustomer,
    StripeEvent,
    Subscription,
    TaxProfile,
    TaxRate,
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
from billing.tax.services import tax_profile_checked, tax_rate_checked
from core.errors import ConflictError, InputError
from core.plain_decimal import PLAIN_DECIMALS


class CostRateForm(forms.ModelForm):
    class Meta:
        model = CostRate
        fields = CostRate.INPUT_FIELDS

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            candidate = construct_instance(self, copy.copy(self.instance))
            now = timezone.now() if candidate.pk else None
            try:
                cost_rate_check(candidate, now=now)  # a ValidationError lands on its field
            except CostPeriodClosedError as error:
                self.add_error("effective_from", str(error).removeprefix("effective_from: "))
        return cleaned


class CostPeriodReopeningForm(forms.ModelForm):
    class Meta:
        model = CostPeriodReopening
        fields = ["start", "end", "reason"]

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            try:
                cost_period_reopen_check(**cleaned)
            except BillingInputError as error:
                self.add_error(error.field if error.field in cleaned else None, error.message)
        return cleaned


@admin.register(CostPeriodReopening)
class CostPeriodReopeningAdmin(admin.ModelAdmin):
    """Added with a reason, through the same service as the API; never
    edited after (the record of who reopened what, when and why)."""

    form = CostPeriodReopeningForm
    list_display = ["start", "end", "reason", "reopened_by", "reopened_at"]

    def has_change_permission(self, request, obj=None):
        return obj is None

    def save_model(self, request, obj, form, change):
        obj.pk = cost_period_reopen(**form.cleaned_data, user=request.user).pk


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(CostRate)
class CostRateAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    form = CostRateForm
    list_display = CostRate.INPUT_FIELDS[:-1]
    list_filter = ["component", "pool", "scenario"]
    date_hierarchy = "effective_from"

    def get_readonly_fields(self, request, obj=None):
        if obj is not None and obj.effective_from <= timezone.now():
            return [f.name for f in CostRate._meta.fields]
        return ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        if change:
            cost_rate_update(rate=obj, **{k: getattr(obj, k) for k in EDITABLE})
        else:
            obj.pk = cost_rate_create(**form.cleaned_data, user=request.user).pk


class FxRateForm(forms.ModelForm):
    class Meta:
        model = FxRate
        fields = ["base", "quote", "date", "rate", "source"]
        help_texts = {"rate": "Units of quote per one base (EUR/USD 1.08: 1 EUR = 1.08 USD)."}

    def clean_base(self):
        return self.cleaned_data["base"].strip().upper()

    def clean_quote(self):
        return self.cleaned_data["quote"].strip().upper()


@admin.register(FxRate)
class FxRateAdmin(admin.ModelAdmin):
    """Dated FX rates margin reports convert revenue with (billing.fx); a
    file of reference rates goes in with `manage.py fx_rates_import`."""

    formfield_overrides = PLAIN_DECIMALS
    form = FxRateForm
    list_display = ["date", "base", "quote", "rate", "source", "created_by"]
    list_filter = ["base", "quote", "source"]
    date_hierarchy = "date"
    readonly_fields = ["created_by", "created_at"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.created_by = request.user
        super().save_model(request, obj, form, change)


@admin.register(CostScenario)
class CostScenarioAdmin(admin.ModelAdmin):
    list_display = ["name", "start", "end", "idle_cost_policy", "created_at"]
    search_fields = ["name"]


@admin.register(AllocationRun)
class AllocationRunAdmin(ReadOnlyAdmin):
    list_display = ["id", "scenario", "start", "end", "status", "progress_percent", "created_at"]
    list_filter = ["status", "scenario"]

    @admin.display(description="progress")
    def progress_percent(self, run: AllocationRun) -> str:
        return f"{run.hours_done}/{run.hours_total} h ({run.progress:.0%})"


@admin.register(PoolHourCost)
class PoolHourCostAdmin(ReadOnlyAdmin):
    list_display = [
        "hour",
        "pool",
        "gpus",
        "busy_seconds",
        "capacity_seconds",
        "total",
        "allocated",
        "unallocated",
        "scenario",
    ]
    list_filter = ["pool", "pool_kind", "scenario"]
    date_hierarchy = "hour"


@admin.register(CostAllocation)
class CostAllocationAdmin(ReadOnlyAdmin):
    list_display = [
        "hour",
        "tenant",
        "pool",
        "served_model",
        "device_seconds",
        "capital",
        "energy",
        "other_opex",
        "idle",
        "total",
        "scenario",
    ]
    list_filter = ["pool_kind", "pool", "scenario"]
    search_fields = ["tenant__slug"]
    date_hierarchy = "hour"


class _DryRun(Exception):
    """Rolls back a service run only to see what it refuses."""


def service_refusal(form: forms.Form, run) -> None:
    """Run a write service inside a savepoint rolled back, so the form
    refuses what the service would (its error on the field it names, a
    409's message on the form), with the very checks the save makes."""
    # The audit trail names who wrote from the transaction's first write on
    # (audit.context sets it then, on the session); were that write the
    # dry run's, the rollback would take the name with it and the real
    # save would be recorded as nobody's. A statement that is not a read
    # sets it first, outside the savepoint.
    with connection.cursor() as cursor:
        cursor.execute("VALUES (1)")
    try:
        with transaction.atomic():
            run()
            raise _DryRun
    except _DryRun:
        pass
    except InputError as error:
        field = error.field if error.field in form.fields else None
        form.add_error(field, error.message)
    except TermsDatedError as error:
        field = error.field if error.field in form.fields else None
        form.add_error(field, str(error).removeprefix(f"{error.field}: "))
    except ConflictError as error:
        form.add_error(None, str(error))


class _VersionedAdmin(admin.ModelAdmin):
    """A row that has taken effect (`frozen`) is shown read-only; a POST
    changing it is refused with the service's message, never saved."""

    def frozen(self, obj) -> ConflictError | None:
        raise NotImplementedError

    def refusal(self, request, obj) -> ConflictError | None:
        return None if obj is None else self.frozen(obj)

    def get_readonly_fields(self, request, obj=None):
        if self.refusal(request, obj) is not None:
            return [f.name for f in self.model._meta.fields]
        return super().get_readonly_fields(request, obj)

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        obj = self.get_object(request, object_id) if object_id else None
        refusal = self.refusal(request, obj)
        if refusal is not None:
            if request.method == "POST":
                self.message_user(request, str(refusal), messages.ERROR)
                return HttpResponseRedirect(request.path)
            self.message_user(request, self.frozen_note(obj, refusal), messages.WARNING)
        return super().changeform_view(request, object_id, form_url, extra_context)

    def frozen_note(self, obj, refusal: ConflictError) -> str:
        return f"Read-only: {refusal}"


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
class PriceBookAdmin(_VersionedAdmin):
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
class ModelPriceAdmin(_VersionedAdmin):
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
class PlanAdmin(_VersionedAdmin):
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
class SubscriptionAdmin(_VersionedAdmin):
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


@admin.register(CreditGrant)
class CreditGrantAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["tenant", "amount", "currency", "granted_at", "expires_at", "priority"]


class _CheckedForm(forms.ModelForm):
    """A form whose fields a tax service checks: its error lands on the
    field it names, and the cleaned values are the service's."""

    check: staticmethod  # the service's check: its fields -> the cleaned values
    checked: tuple[str, ...] = ()  # the fields the check takes

    def clean(self):
        cleaned = super().clean()
        if not self.errors:
            try:
                cleaned.update(self.check(**{f: cleaned.get(f) for f in self.checked}))
            except BillingInputError as error:
                self.add_error(error.field if error.field in self.fields else None, error.message)
        return cleaned


class TaxRateForm(_CheckedForm):
    check = staticmethod(tax_rate_checked)
    checked = ("country", "name", "percent", "valid_from")

    class Meta:
        model = TaxRate
        fields = ["country", "name", "percent", "valid_from"]


class TaxProfileForm(_CheckedForm):
    check = staticmethod(tax_profile_checked)
    checked = ("country", "tax_id", "exempt", "exempt_reason")

    class Meta:
        model = TaxProfile
        fields = ["tenant", "country", "tax_id", "exempt", "exempt_reason"]


@admin.register(TaxRate)
class TaxRateAdmin(admin.ModelAdmin):
    """Dated rates per jurisdiction: a rate is never edited (issued invoices
    name it); a new one takes over from its day."""

    formfield_overrides = PLAIN_DECIMALS
    form = TaxRateForm
    list_display = ["country", "name", "percent", "valid_from", "stripe_tax_rate_id"]
    list_filter = ["country"]

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(TaxProfile)
class TaxProfileAdmin(admin.ModelAdmin):
    form = TaxProfileForm
    list_display = ["tenant", "country", "tax_id", "exempt"]
    search_fields = ["tenant__slug", "tax_id"]


@admin.register(Issuer)
class IssuerAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "country",
        "tax_id",
        "is_default",
        "invoice_prefix",
        "next_invoice_number",
    ]
    readonly_fields = ["next_invoice_number", "next_credit_note_number"]


class InvoiceLineInline(admin.TabularInline):
    model = InvoiceLine
    extra = 0
    can_delete = False
    fields = ["position", "kind", "description", "quantity", "unit_price", "amount", "amount_minor"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    """Invoices change only through the invoice services (finalize, status,
    credit notes: the finance API); the database refuses edits of a
    finalized one anyway."""

    list_display = ["__str__", "tenant", "period_start", "status", "total_minor", "stripe_sync"]
    list_filter = ["status", "stripe_sync"]
    search_fields = ["number", "tenant__name", "tenant__slug"]
    inlines = [InvoiceLineInline]

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(CreditNote)
class CreditNoteAdmin(ReadOnlyAdmin):
    list_display = ["number", "invoice", "amount_minor", "reason", "created_at"]

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(InvoiceRun)
class InvoiceRunAdmin(ReadOnlyAdmin):
    list_display = ["pk", "as_of", "status", "tenants_done", "tenants_total", "invoices_created"]


@admin.register(BudgetState)
class BudgetStateAdmin(ReadOnlyAdmin):
    list_display = [
        "tenant",
        "period_start",
        "spend",
        "budget",
        "soft_notified_at",
        "hard_reached_at",
    ]


@admin.register(MarginReport)
class MarginReportAdmin(ReadOnlyAdmin):
    list_display = ["__str__", "period_start", "period_end", "status", "finished_at"]
    exclude = ["csv", "html"]


@admin.register(StripeCustomer)
class StripeCustomerAdmin(admin.ModelAdmin):
    """Each tenant's customer in Stripe (created by the first invoice sync)."""

    list_display = ["tenant", "stripe_customer_id", "created_at"]
    search_fields = ["stripe_customer_id", "tenant__name", "tenant__slug"]
    autocomplete_fields = ["tenant"]
    readonly_fields = ["created_at"]


@admin.register(StripeEvent)
class StripeEventAdmin(ReadOnlyAdmin):
    list_display = ["event_id", "type", "created", "processed_at", "outcome"]
    search_fields = ["event_id", "type"]


class SlaCreditRuleInline(admin.TabularInline):
    formfield_overrides = PLAIN_DECIMALS
    model = SlaCreditRule
    extra = 0


@admin.register(SloPolicy)
class SloPolicyAdmin(admin.ModelAdmin):
    """A plan's (or a tier's default) SLO targets and SLA credit schedule.
    A change applies to invoices rated from then on (drafts rebuilt
    included); finalized invoices keep what they said."""

    formfield_overrides = PLAIN_DECIMALS
    list_display = [
        "name",
        "plan",
        "tier",
        "availability_percent",
        "ttft_p95_ms",
        "itl_p95_ms",
        "credit_cap_percent",
    ]
    inlines = [SlaCreditRuleInline]


@admin.register(SlaCreditAdjustment)
class SlaCreditAdjustmentAdmin(ReadOnlyAdmin):
    """Finance's decisions on SLA credits, made on the invoice page or the
    API (never edited)."""

    list_display = ["tenant", "period_start", "metric", "action", "credit_percent", "created_by"]
    list_filter = ["metric", "action"]

    def has_delete_permission(self, request, obj=None):
        return False
