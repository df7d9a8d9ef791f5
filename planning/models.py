"""A plan run and what it found: each pool's and model's demand forecast
(hourly, with its bands and backtest) as of one hour. Runs are kept: a
plan of last month can be read against what came."""

from __future__ import annotations

from decimal import Decimal

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from billing.choices import RunStatus
from billing.models.runs import RunLifecycle
from serving.models import Pool, Replica

BANDS = [
    ("point", "The point forecast"),
    ("80", "The 80% band's top"),
    ("95", "The 95% band's top"),
]
PERCENT = {"max_digits": 5, "decimal_places": 2}
MONEY = {"max_digits": 20, "decimal_places": 2}


class PlanRun(RunLifecycle):
    """Forecasts from the hour `as_of` falls in, `horizon_hours` ahead.
    Progress (series done of series to do) is for a person to watch."""

    as_of = models.DateTimeField()
    horizon_hours = models.PositiveIntegerField(default=720)
    series_total = models.PositiveIntegerField(default=0)
    series_done = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")
    # What finance chose: the demand GPUs are sized for, the headroom on
    # top, and the margin price floors reach.
    band = models.CharField(max_length=8, choices=BANDS, default="95")
    headroom_percent = models.DecimalField(
        **PERCENT,
        default=Decimal(20),
        validators=[MinValueValidator(0), MaxValueValidator(200)],
    )
    target_margin_percent = models.DecimalField(
        **PERCENT,
        default=Decimal(40),
        validators=[MinValueValidator(-100), MaxValueValidator(Decimal("99.99"))],
    )
    currency = models.CharField(max_length=3, blank=True, default="")
    warnings = models.JSONField(default=list, blank=True)
    # A what-if (planning.whatif): the changes, and the plan they change.
    what_if = models.JSONField(default=dict, blank=True)
    baseline = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="what_ifs"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="planrun_status")
        ]

    def __str__(self) -> str:
        return f"plan as of {self.as_of:%Y-%m-%d %H:00} ({self.status})"


class Metric(models.TextChoices):
    TOKENS = "tokens", "Tokens an hour (prompt and completion)"
    REQUESTS = "requests", "Requests an hour"


class DemandForecast(models.Model):
    """One series' forecast: `point` an hour from `start`, the bands
    {"80": [low, high], "95": [...]} (lists as long), the method the
    backtest chose and every method's MASE, and the two weeks before
    `start` as they were (`recent`), for the chart."""

    run = models.ForeignKey(PlanRun, on_delete=models.CASCADE, related_name="forecasts")
    pool = models.ForeignKey(Pool, null=True, on_delete=models.SET_NULL, related_name="+")
    pool_name = models.CharField(max_length=100)
    model_name = models.CharField(max_length=200)
    metric = models.CharField(max_length=16, choices=Metric.choices)
    method = models.CharField(max_length=16)
    mase = models.JSONField(default=dict)
    start = models.DateTimeField()
    point = models.JSONField(default=list)
    bands = models.JSONField(default=dict)
    recent = models.JSONField(default=list)

    class Meta:
        ordering = ["pool_name", "model_name", "metric"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "pool_name", "model_name", "metric"], name="forecast_once_a_run"
            )
        ]

    def __str__(self) -> str:
        return f"{self.pool_name}/{self.model_name} {self.metric} ({self.method})"


class CapacityEstimate(models.Model):
    """One replica's capacity at its pool's SLO, measured from its load
    hours (planning.capacity): the status, the tokens an hour (None when
    too thin or missed at every load), and the latency-against-load curve."""

    run = models.ForeignKey(PlanRun, on_delete=models.CASCADE, related_name="capacities")
    replica = models.ForeignKey(Replica, null=True, on_delete=models.SET_NULL, related_name="+")
    replica_name = models.CharField(max_length=100)
    pool_name = models.CharField(max_length=100)
    model_name = models.CharField(max_length=200)
    gpus = models.DecimalField(max_digits=8, decimal_places=3)
    ttft_target_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    itl_target_ms = models.DecimalField(max_digits=14, decimal_places=3, null=True)
    status = models.CharField(max_length=16)
    tokens_per_hour = models.BigIntegerField(null=True)
    hours = models.PositiveIntegerField(default=0)
    note = models.CharField(max_length=300)
    curve = models.JSONField(default=list)

    class Meta:
        ordering = ["pool_name", "model_name", "replica_name"]

    def __str__(self) -> str:
        return f"{self.replica_name}: {self.note}"


class PoolPlan(models.Model):
    """One pool's GPUs needed against held and contracted, its flags and
    their money over the horizon (planning.provisioning), in the run's
    currency."""

    run = models.ForeignKey(PlanRun, on_delete=models.CASCADE, related_name="pools")
    pool = models.ForeignKey(Pool, null=True, on_delete=models.SET_NULL, related_name="+")
    pool_name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16)
    gpus_held = models.DecimalField(max_digits=10, decimal_places=3)
    gpus_needed = models.DecimalField(max_digits=10, decimal_places=3, null=True)
    gpus_contracted = models.DecimalField(max_digits=10, decimal_places=3, null=True)
    flags = models.JSONField(default=list)
    busy_percent = models.DecimalField(**PERCENT, null=True)
    cost = models.DecimalField(**MONEY, null=True)
    idle_cost = models.DecimalField(**MONEY, null=True)
    credits_at_risk = models.DecimalField(**MONEY, null=True)
    revenue = models.DecimalField(**MONEY, null=True)  # the month's at today's prices
    margin_percent = models.DecimalField(max_digits=8, decimal_places=1, null=True)
    headroom_percent = models.DecimalField(max_digits=10, decimal_places=1, null=True)
    by_model = models.JSONField(default=list)
    note = models.CharField(max_length=500, blank=True, default="")

    class Meta:
        ordering = ["kind", "pool_name"]

    def __str__(self) -> str:
        return f"{self.pool_name}: {self.gpus_needed} of {self.gpus_held} GPUs ({self.flags})"


class PriceFloor(models.Model):
    """A tier's model: today's prices per million tokens by kind, and the
    floor at which the forecast month reaches the run's target margin
    (planning.floors), in the run's currency."""

    run = models.ForeignKey(PlanRun, on_delete=models.CASCADE, related_name="floors")
    tier = models.CharField(max_length=16)
    model_name = models.CharField(max_length=200)
    tokens = models.JSONField(default=dict)  # the month's forecast by kind
    today = models.JSONField(default=dict)  # kind -> price, as text
    floor = models.JSONField(null=True)  # kind -> price, as text; None: no floor
    cost = models.DecimalField(**MONEY)
    revenue = models.DecimalField(**MONEY)
    margin_percent = models.DecimalField(max_digits=8, decimal_places=1, null=True)
    note = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["tier", "model_name"]

    def __str__(self) -> str:
        return f"{self.tier}/{self.model_name}: {self.floor}"
