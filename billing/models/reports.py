"""Margin reports as stored documents: a period's figures by tier, pool,
tenant and model beside the period before, as CSV and as HTML."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q

from billing.choices import ReportKind
from billing.models.runs import RunLifecycle


class MarginReport(RunLifecycle):
    """One report of [period_start, period_end): a weekly flash, a monthly
    close, or one asked for, against [previous_start, previous_end). Money
    is in `currency` (the reporting currency when it was built): revenue
    converted from each billing currency at the rates listed in `fx_rates`,
    the original amounts kept beside it. Re-running the same kind and
    period replaces its content (booked data may have changed: late usage,
    a re-run, a rate entered)."""

    kind = models.CharField(max_length=16, choices=ReportKind.choices)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    previous_start = models.DateTimeField()
    # Empty on reports from before it existed: the previous period then
    # ran up to period_start.
    previous_end = models.DateTimeField(null=True, blank=True)
    currency = models.CharField(max_length=3, blank=True, default="")
    fx_rates = models.JSONField(default=list, blank=True)  # the conversions used
    forecast = models.JSONField(default=dict, blank=True)  # month-to-date run rate
    totals = models.JSONField(default=dict, blank=True)  # revenue, cost, margin (decimal strings)
    tables = models.JSONField(default=dict, blank=True)  # level -> rows, for the dashboard
    csv = models.TextField(blank=True, default="")
    html = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")

    class Meta:
        ordering = ["-period_start", "kind"]
        constraints = [
            models.UniqueConstraint(
                fields=["kind", "period_start", "period_end"], name="marginreport_period"
            ),
            models.CheckConstraint(
                condition=Q(period_end__gt=F("period_start")), name="marginreport_order"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} {self.period_start:%Y-%m-%d}"

    @property
    def previous_period_end(self):
        return self.previous_end or self.period_start
