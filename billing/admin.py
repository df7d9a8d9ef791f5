"""Finance staff's admin for costs. Rates are written through the rate
service (overlaps refused, a change closes the rate it replaces; a rate in
effect is read-only); runs and results are read-only records."""

import copy

from django import forms
from django.contrib import admin
from django.forms.models import construct_instance
from django.utils import timezone

from billing.costs.closing import cost_period_reopen, cost_period_reopen_check
from billing.costs.rates import EDITABLE, cost_rate_check, cost_rate_create, cost_rate_update
from billing.errors import BillingInputError, CostPeriodClosedError
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
from billing.tax.services import tax_profile_checked, tax_rate_checked
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
    """Dated FX rates margin reports convert revenue with (billing.reports.fx); a
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


class ModelPriceInline(admin.TabularInline):
    formfield_overrides = PLAIN_DECIMALS
    model = ModelPrice
    extra = 0


@admin.register(PriceBook)
class PriceBookAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["name", "version", "tier", "currency", "effective_from", "effective_to"]
    list_filter = ["name", "tier"]
    inlines = [ModelPriceInline]


class VolumeTierInline(admin.TabularInline):
    formfield_overrides = PLAIN_DECIMALS
    model = VolumeTier
    extra = 0


@admin.register(ModelPrice)
class ModelPriceAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
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


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["name", "currency", "minimum_commit", "discount_percent"]


@admin.register(Subscription)
class SubscriptionAdmin(admin.ModelAdmin):
    list_display = ["tenant", "plan", "anchor_day", "start", "end"]
    list_filter = ["plan"]


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
