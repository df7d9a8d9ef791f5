from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.models import BaseInlineFormSet
from django.utils import timezone

from core.errors import InputError
from core.plain_decimal import PLAIN_DECIMALS
from serving.gpu_shares import Share
from serving.models import (
    Gpu,
    GpuSku,
    GridIntensity,
    LoraAdapter,
    Node,
    Pool,
    Replica,
    ReplicaGpu,
    ReplicaMetricSample,
    Reservation,
    ServedModel,
)
from serving.services import replica_gpu_shares_checked, replica_gpu_shares_set


@admin.register(GpuSku)
class GpuSkuAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = [
        "name",
        "memory_gb",
        "list_price",
        "currency",
        "power_idle_watts",
        "power_busy_watts",
        "mig_capable",
    ]
    search_fields = ["name"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "site"]
    list_filter = ["site"]
    search_fields = ["name", "site"]


@admin.register(GridIntensity)
class GridIntensityAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["site", "period", "start", "g_per_kwh", "source"]
    list_filter = ["site", "period"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = [
        "serial",
        "sku",
        "node",
        "in_service_date",
        "capex",
        "useful_life_months",
        "lease_rate_per_hour",
    ]
    list_filter = ["sku", "node__site", ("lease_rate_per_hour", admin.EmptyFieldListFilter)]
    search_fields = ["serial", "node__name"]


@admin.register(Pool)
class PoolAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "owner", "idle_cost_policy", "disaggregated"]
    list_filter = ["kind", "idle_cost_policy", "disaggregated"]
    search_fields = ["name", "owner__name"]


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    formfield_overrides = PLAIN_DECIMALS
    list_display = ["name", "task", "chars_per_token", "max_context_tokens"]
    list_filter = ["task"]
    search_fields = ["name"]


@admin.register(LoraAdapter)
class LoraAdapterAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "base_model", "upstream_name"]
    list_filter = ["base_model"]
    search_fields = ["name", "tenant__name"]


class GpuSharesFormSet(BaseInlineFormSet):
    """The replica's GPU shares, checked together and against the other
    replicas' shares of the same GPUs by serving.services, then written by it."""

    def shares(self) -> list[Share]:
        out = []
        for form in self.forms:
            data = getattr(form, "cleaned_data", None)
            if not data or data.get("DELETE") or not data.get("gpu"):
                continue
            out.append(Share.asked(data["gpu"].pk, data))
        return out

    def clean(self):
        super().clean()
        if any(self.errors):
            return
        try:
            replica_gpu_shares_checked(replica=self.instance, shares=self.shares())
        except InputError as bad:
            raise ValidationError(f"{bad.field}: {bad.message}") from None


class ReplicaGpuInline(admin.TabularInline):
    model = ReplicaGpu
    formset = GpuSharesFormSet
    fields = ["gpu", "sharing", "mig_profile", "mig_instance", "share_percent", "units"]
    readonly_fields = ["units"]
    autocomplete_fields = ["gpu"]
    extra = 0


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "base_url",
        "engine",
        "role",
        "model",
        "pool",
        "status",
        "status_since",
        "max_inflight",
        "concurrency",
        "concurrency_limit",
        "front",
        "last_seen_at",
    ]
    list_filter = ["status", "engine", "role", "pool__kind", "model"]
    search_fields = ["name", "base_url", "engine_instance"]
    # A worker's frontend and id are its frontend's listing (serving.engine_workers).
    readonly_fields = [
        "status_since",
        "concurrency_limit",
        "concurrency_limit_at",
        "front",
        "engine_instance",
    ]
    inlines = [ReplicaGpuInline]
    # A replica's URL is the engine's on the private network, usually http.
    formfield_overrides = {models.URLField: {"assume_scheme": "http"}}

    def save_model(self, request, obj, form, change):
        if not change or "status" in form.changed_data:
            obj.status_since = timezone.now()
        super().save_model(request, obj, form, change)

    def save_formset(self, request, form, formset, change):
        if isinstance(formset, GpuSharesFormSet):
            rows = replica_gpu_shares_set(replica=form.instance, shares=formset.shares())
            # What the admin's change message reads of a saved formset.
            formset.new_objects, formset.changed_objects, formset.deleted_objects = rows, [], []
        else:
            super().save_formset(request, form, formset, change)


@admin.register(Reservation)
class ReservationAdmin(admin.ModelAdmin):
    list_display = ["tenant", "pool", "gpu_count", "start", "end"]
    list_filter = ["pool"]
    search_fields = ["tenant__name", "pool__name"]


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(ReplicaMetricSample)
class ReplicaMetricSampleAdmin(ReadOnlyAdmin):
    list_display = [
        "replica",
        "scraped_at",
        "up",
        "requests_running",
        "requests_waiting",
        "kv_cache_usage",
        "prompt_tokens_total",
        "generation_tokens_total",
    ]
    list_filter = ["up", "replica"]
    date_hierarchy = "scraped_at"
