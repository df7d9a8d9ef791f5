"""A plan run and what it found: each pool's and model's demand forecast
(hourly, with its bands and backtest) as of one hour. Runs are kept: a
plan of last month can be read against what came."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from billing.choices import RunStatus
from billing.models.runs import RunLifecycle
from serving.models import Pool


class PlanRun(RunLifecycle):
    """Forecasts from the hour `as_of` falls in, `horizon_hours` ahead.
    Progress (series done of series to do) is for a person to watch."""

    as_of = models.DateTimeField()
    horizon_hours = models.PositiveIntegerField(default=720)
    series_total = models.PositiveIntegerField(default=0)
    series_done = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")

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
