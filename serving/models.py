"""The fleet: GPUs and where they sit, the pools they are sold in, the vLLM
replicas that run on them, reservations, the model catalogue, and samples
of each replica's own Prometheus counters."""

from __future__ import annotations

from datetime import UTC
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from core.currencies import currency_validate
from core.fields import SupportedDateField, SupportedDateTimeField
from serving.choices import (
    Concurrency,
    Engine,
    GpuSharing,
    IdleCostPolicy,
    IntensityPeriod,
    ModelTask,
    PoolKind,
    ReplicaRole,
    ReplicaStatus,
)
from serving.gpu_shares import GPU_UNITS
from tenants.models import Tenant


def _money(ceiling: int) -> list:
    return [MinValueValidator(Decimal(0)), MaxValueValidator(Decimal(ceiling))]


# What is physically possible, in any currency's units (a GPU bought for
# 1,000,000,000 yen or won is possible; 6e12 is a typo): bad input is a 400
# naming the field, not a fleet whose cost is off by orders of magnitude.
MAX_GPU_PRICE = 1_000_000_000
MAX_LEASE_PER_HOUR = 1_000_000
MAX_WATTS = 5_000  # per GPU; the largest accelerators draw 1-1.5 kW
MONEY = {"max_digits": 20, "decimal_places": 4, "validators": _money(MAX_GPU_PRICE)}
RATE = {"max_digits": 24, "decimal_places": 9, "validators": _money(MAX_LEASE_PER_HOUR)}
CURRENCY = {"max_length": 3, "default": "USD", "validators": [currency_validate]}
WATTS = [MaxValueValidator(MAX_WATTS)]


class GpuSku(models.Model):
    """A GPU model as bought: its list price and power draw idle and busy."""

    name = models.CharField(max_length=100, unique=True)
    memory_gb = models.PositiveIntegerField(
        default=80, validators=[MinValueValidator(1), MaxValueValidator(4096)]
    )
    list_price = models.DecimalField(**MONEY, default=Decimal(0))
    currency = models.CharField(**CURRENCY)
    power_idle_watts = models.PositiveIntegerField(validators=WATTS)
    power_busy_watts = models.PositiveIntegerField(validators=[MinValueValidator(1), *WATTS])
    mig_capable = models.BooleanField(
        default=False, help_text="Can be partitioned into MIG instances (A100, H100, H200)."
    )

    class Meta:
        ordering = ["name"]
        verbose_name = "GPU SKU"
        constraints = [
            models.CheckConstraint(
                condition=Q(power_busy_watts__gte=F("power_idle_watts")),
                name="gpusku_busy_ge_idle",
            )
        ]

    def __str__(self) -> str:
        return self.name


class Node(models.Model):
    """A server in a site that holds GPUs."""

    name = models.CharField(max_length=100, unique=True)
    site = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Gpu(models.Model):
    """One physical GPU: owned (capex depreciated straight-line over its
    useful life from its in-service date, down to salvage) or leased (an
    hourly rate). Exactly one of the two."""

    serial = models.CharField(max_length=100, unique=True)
    sku = models.ForeignKey(GpuSku, on_delete=models.PROTECT, related_name="gpus")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="gpus")
    in_service_date = SupportedDateField()
    capex = models.DecimalField(**MONEY, null=True, blank=True)
    useful_life_months = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(240)]
    )
    salvage_value = models.DecimalField(**MONEY, default=Decimal(0))
    lease_rate_per_hour = models.DecimalField(**RATE, null=True, blank=True)
    currency = models.CharField(**CURRENCY)

    class Meta:
        ordering = ["serial"]
        verbose_name = "GPU"
        constraints = [
            models.CheckConstraint(
                condition=(
                    Q(
                        capex__isnull=False,
                        useful_life_months__gt=0,
                        lease_rate_per_hour__isnull=True,
                    )
                    | Q(capex__isnull=True, lease_rate_per_hour__isnull=False)
                ),
                name="gpu_owned_xor_leased",
            ),
            models.CheckConstraint(
                condition=Q(capex__isnull=True) | Q(salvage_value__lte=F("capex")),
                name="gpu_salvage_le_capex",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.serial} ({self.sku})"


class Pool(models.Model):
    """GPUs sold one way. Shared: any tenant, busy cost by use, idle cost by
    `idle_cost_policy`. Reserved and dedicated: owned by one tenant."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=PoolKind.choices)
    owner = models.ForeignKey(
        Tenant, null=True, blank=True, on_delete=models.PROTECT, related_name="pools"
    )
    idle_cost_policy = models.CharField(
        max_length=16, choices=IdleCostPolicy.choices, default=IdleCostPolicy.SPREAD
    )
    disaggregated = models.BooleanField(
        default=False,
        help_text=(
            "Prefill and decode on different replicas: each replica of the pool is a prefill "
            "or a decode replica, and a request runs on one of each."
        ),
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=PoolKind.values), name="pool_kind_valid"),
            models.CheckConstraint(
                condition=Q(kind=PoolKind.SHARED, owner__isnull=True)
                | (~Q(kind=PoolKind.SHARED) & Q(owner__isnull=False)),
                name="pool_owner_iff_not_shared",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"


class ServedModel(models.Model):
    """A public model name tenants call; replicas serve it."""

    name = models.CharField(max_length=200, unique=True)
    description = models.CharField(max_length=500, blank=True, default="")
    chars_per_token = models.DecimalField(
        max_digits=6,
        decimal_places=2,
        default=Decimal(4),
        help_text="Used to estimate prompt tokens at admission, before vLLM counts them.",
    )
    max_context_tokens = models.PositiveIntegerField(default=4096)
    # What its replicas run it for (vLLM's `--runner pooling --convert embed`
    # makes an embedding model): the gateway refuses an endpoint it cannot
    # serve before anything is sent to a replica.
    task = models.CharField(max_length=16, choices=ModelTask.choices, default=ModelTask.GENERATE)
    # For roofline attribution (docs/architecture.md, Attribution): bytes of weights a decode step
    # reads once for the whole batch, and KV-cache bytes per token of context.
    weight_bytes = models.BigIntegerField(null=True, blank=True)
    kv_bytes_per_token = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class LoraAdapter(models.Model):
    """A tenant's private fine-tune of a served model: only that tenant may
    call it by `name`; vLLM knows it as `upstream_name`."""

    name = models.CharField(max_length=200, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="lora_adapters")
    base_model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="adapters")
    upstream_name = models.CharField(max_length=200)

    class Meta:
        ordering = ["name"]
        verbose_name = "LoRA adapter"

    def __str__(self) -> str:
        return f"{self.name} ({self.tenant})"


class Replica(models.Model):
    """An OpenAI-compatible inference server (vLLM, or another engine)
    serving one model on some GPUs."""

    name = models.CharField(max_length=100, unique=True)
    base_url = models.URLField(help_text="e.g. http://10.0.0.5:8000 (without /v1)")
    engine = models.CharField(
        max_length=16,
        choices=Engine.choices,
        default=Engine.VLLM,
        help_text="The inference server: how the gateway reads its usage and timing.",
    )
    role = models.CharField(
        max_length=8,
        choices=ReplicaRole.choices,
        default=ReplicaRole.BOTH,
        help_text="In a disaggregated pool: prefill or decode.",
    )
    model = models.ForeignKey(ServedModel, on_delete=models.PROTECT, related_name="replicas")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="replicas")
    gpus = models.ManyToManyField(Gpu, blank=True, related_name="replicas", through="ReplicaGpu")
    status = models.CharField(
        max_length=16, choices=ReplicaStatus.choices, default=ReplicaStatus.UP
    )
    max_inflight = models.PositiveIntegerField(
        default=64,
        help_text="Requests in flight beyond which routing spills elsewhere: the fixed "
        "number, or the most the adaptive one may reach.",
    )
    concurrency = models.CharField(
        max_length=8,
        choices=Concurrency.choices,
        default=Concurrency.ADAPTIVE,
        help_text="Adaptive: the gateway finds how many requests to run at once from the "
        "replica's step time (vLLM's /metrics), up to max_inflight. Fixed: max_inflight.",
    )
    # What the gateways found (adaptive): written by them every few seconds.
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    concurrency_limit_at = models.DateTimeField(null=True, blank=True)
    # When `status` last changed (a gateway's health check, the scraper,
    # registration, an operator); with `last_error`, why it went down.
    status_since = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    launched_pid = models.PositiveIntegerField(
        null=True, blank=True, help_text="Set for replicas started by vllm_up on this machine."
    )
    # A worker behind a frontend that routes to it itself (NVIDIA Dynamo's):
    # never routed to by the gateway (its frontend is), registered from the
    # frontend's /health (serving.engine_workers), named in its answers by
    # `engine_instance`. Its GPUs and the rows of the requests it served are
    # its own: GPU-seconds and attribution per worker.
    front = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="workers",
        help_text="The frontend this worker serves behind (Dynamo); empty for a replica "
        "the gateway routes to.",
    )
    engine_instance = models.CharField(
        max_length=40,
        blank=True,
        default="",
        help_text="The engine's own id for this worker (Dynamo's instance id).",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=ReplicaStatus.values), name="replica_status_valid"
            ),
            models.CheckConstraint(condition=Q(max_inflight__gt=0), name="replica_max_inflight"),
            models.CheckConstraint(
                condition=Q(engine__in=Engine.values), name="replica_engine_valid"
            ),
            models.CheckConstraint(
                condition=Q(role__in=ReplicaRole.values), name="replica_role_valid"
            ),
            models.CheckConstraint(
                condition=Q(concurrency__in=Concurrency.values), name="replica_concurrency_valid"
            ),
            models.UniqueConstraint(
                fields=["front", "engine_instance"],
                condition=Q(front__isnull=False),
                name="replica_worker_instance_unique",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        if self.front_id is not None:  # its role is its frontend's split, not its pool's
            return
        problem = role_misfit(self.pool if self.pool_id else None, self.role)
        if problem:
            raise ValidationError({"role": problem})


def role_misfit(pool: Pool | None, role: str) -> str | None:
    """Why a replica of `role` cannot be in `pool`, or None: a
    disaggregated pool's replicas are prefill or decode replicas, and only
    its replicas are."""
    if pool is None:
        return None
    if pool.disaggregated and role == ReplicaRole.BOTH:
        return f"pool {pool.name} is disaggregated: a replica there is a prefill or a decode one"
    if not pool.disaggregated and role != ReplicaRole.BOTH:
        return f"pool {pool.name} is not disaggregated: a {role} replica needs one that is"
    return None


class ReplicaGpu(models.Model):
    """A replica's hold on one GPU: the whole of it, a MIG instance, or a
    time-sliced share; `units` of GPU_UNITS (serving.gpu_shares), set by
    serving.services from the rest, never by hand."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="gpu_shares")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="replica_shares")
    sharing = models.CharField(max_length=16, choices=GpuSharing.choices, default=GpuSharing.WHOLE)
    mig_profile = models.CharField(max_length=20, blank=True, default="")
    mig_instance = models.PositiveSmallIntegerField(null=True, blank=True)
    share_percent = models.PositiveSmallIntegerField(null=True, blank=True)
    units = models.PositiveIntegerField(default=GPU_UNITS)

    class Meta:
        db_table = "serving_replica_gpus"
        verbose_name = "replica's GPU share"
        unique_together = [("replica", "gpu")]  # as the table was made, before shares
        constraints = [
            models.UniqueConstraint(
                fields=["gpu", "mig_instance"],
                condition=Q(sharing=GpuSharing.MIG),
                name="replica_gpu_mig_instance_once",
            ),
            models.CheckConstraint(
                condition=Q(units__gt=0, units__lte=GPU_UNITS), name="replica_gpu_units"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.replica} on {self.gpu.serial}: {self.describe()}"

    def describe(self) -> str:
        if self.sharing == GpuSharing.MIG:
            return f"MIG {self.mig_profile} (instance {self.mig_instance})"
        if self.sharing == GpuSharing.TIME_SLICED:
            return f"{self.share_percent}% time-sliced"
        return "whole"


class Reservation(models.Model):
    """A tenant holds `gpu_count` GPUs of a reserved pool over [start, end)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="reservations")
    pool = models.ForeignKey(Pool, on_delete=models.PROTECT, related_name="reservations")
    gpu_count = models.PositiveIntegerField()
    start = SupportedDateTimeField()
    end = SupportedDateTimeField()

    class Meta:
        ordering = ["-start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="reservation_end_after"),
            models.CheckConstraint(condition=Q(gpu_count__gt=0), name="reservation_gpus"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant}: {self.gpu_count} GPU in {self.pool}"


class ReplicaMetricSample(models.Model):
    """One scrape of a replica's Prometheus /metrics. The token counters
    are vLLM's own totals (aborted requests included): the baseline that
    metering reconciles the billed tokens against."""

    replica = models.ForeignKey(Replica, on_delete=models.CASCADE, related_name="samples")
    scraped_at = models.DateTimeField()
    up = models.BooleanField()
    requests_running = models.PositiveIntegerField(null=True)
    requests_waiting = models.PositiveIntegerField(null=True)
    kv_cache_usage = models.DecimalField(max_digits=7, decimal_places=6, null=True)
    prompt_tokens_total = models.BigIntegerField(null=True)
    generation_tokens_total = models.BigIntegerField(null=True)
    preemptions_total = models.BigIntegerField(null=True)
    error = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-scraped_at"]
        indexes = [models.Index(fields=["replica", "-scraped_at"], name="sample_replica_time")]

    def __str__(self) -> str:
        return f"{self.replica} @ {self.scraped_at:%Y-%m-%d %H:%M:%S}"


def grid_intensity_check(*, period: str, start) -> None:
    """A period's start: an hour's first instant (UTC), or for a year its
    first hour (1 January, 00:00 UTC). ValidationError naming `start`."""
    if start is None:
        return
    start = start.astimezone(UTC)
    if start.minute or start.second or start.microsecond:
        raise ValidationError({"start": "must be the start of an hour (UTC)"})
    if period == IntensityPeriod.YEAR and (start.month, start.day, start.hour) != (1, 1, 0):
        raise ValidationError({"start": "a year's average starts on 1 January, 00:00 UTC"})


class GridIntensity(models.Model):
    """The carbon intensity of a site's grid (Node.site), grams of CO2e per
    kWh: for one hour, or a year's average where that is all the operator
    has (an hour's own figure is used before its year's average)."""

    site = models.CharField(max_length=100)
    period = models.CharField(max_length=8, choices=IntensityPeriod.choices)
    start = models.DateTimeField(help_text="The hour, or for a year 1 January 00:00 UTC.")
    g_per_kwh = models.DecimalField(
        max_digits=9,
        decimal_places=3,
        validators=[MinValueValidator(0), MaxValueValidator(5000)],
        help_text="gCO2e per kWh drawn from the grid.",
    )
    source = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        ordering = ["site", "period", "start"]
        verbose_name_plural = "grid intensities"
        constraints = [
            models.UniqueConstraint(fields=["site", "period", "start"], name="grid_intensity_once")
        ]

    def __str__(self) -> str:
        return f"{self.site} {self.period} {self.start:%Y-%m-%d %H:00}: {self.g_per_kwh} g/kWh"

    def clean(self) -> None:
        grid_intensity_check(period=self.period, start=self.start)
