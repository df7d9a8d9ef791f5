from django.contrib import admin

from serving.models import (
    Gpu,
    GpuSku,
    LoraAdapter,
    Node,
    Pool,
    Replica,
    ReplicaMetricSample,
    Reservation,
    ServedModel,
)


@admin.register(GpuSku)
class GpuSkuAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "memory_gb",
        "list_price",
        "currency",
        "power_idle_watts",
        "power_busy_watts",
    ]
    search_fields = ["name"]


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ["name", "site"]
    list_filter = ["site"]
    search_fields = ["name", "site"]


@admin.register(Gpu)
class GpuAdmin(admin.ModelAdmin):
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
    list_display = ["name", "kind", "owner", "idle_cost_policy"]
    list_filter = ["kind", "idle_cost_policy"]
    search_fields = ["name", "owner__name"]


@admin.register(ServedModel)
class ServedModelAdmin(admin.ModelAdmin):
    list_display = ["name", "chars_per_token", "max_context_tokens"]
    search_fields = ["name"]


@admin.register(LoraAdapter)
class LoraAdapterAdmin(admin.ModelAdmin):
    list_display = ["name", "tenant", "base_model", "upstream_name"]
    list_filter = ["base_model"]
    search_fields = ["name", "tenant__name"]


@admin.register(Replica)
class ReplicaAdmin(admin.ModelAdmin):
    list_display = ["name", "base_url", "model", "pool", "status", "max_inflight", "last_seen_at"]
    list_filter = ["status", "pool__kind", "model"]
    search_fields = ["name", "base_url"]
    filter_horizontal = ["gpus"]


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
