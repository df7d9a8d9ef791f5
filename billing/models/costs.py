"""The cost side of billing: dated cost rates, what-if scenarios, allocation
runs, and their results per pool-hour and per (hour, tenant, pool, model).
Rows with no scenario are the booked results; a scenario's rows sit apart
and never touch them."""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.indexes import BrinIndex
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import F, Q

from billing.choices import CostComponent, RateBasis, RunStatus
from billing.models.runs import RunLifecycle
from billing.money import COST
from core.currencies import currency_validate
from core.fields import SupportedDateTimeField
from serving.choices import IdleCostPolicy, PoolKind
from serving.models import Pool, ServedModel
from tenants.models import Tenant

SECONDS = {"max_digits": 20, "decimal_places": 6}
# Result rows are derived in bulk from rows already checked (the fleet, the
# ledger's rollups): their copied keys carry no database constraint, which
# would cost a lookup per row on every write (as in metering's shares).
DERIVED = {"db_constraint": False, "on_delete": models.DO_NOTHING, "related_name": "+"}


class CostScenario(models.Model):
    """A named what-if: a past period re-allocated under other rates (its
    own CostRate rows replace the booked ones of the same component) and/or
    another idle-cost policy for every shared pool."""

    name = models.CharField(max_length=100, unique=True)
    description = models.CharField(max_length=500, blank=True, default="")
    start = SupportedDateTimeField()
    end = SupportedDateTimeField()
    idle_cost_policy = models.CharField(
        max_length=16, choices=IdleCostPolicy.choices, blank=True, default=""
    )
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="scenario_end_after")
        ]

    def __str__(self) -> str:
        return self.name


class CostRate(models.Model):
    """One dated rate: from `effective_from` until `effective_to` (open when
    empty), for one pool or every pool, and for energy optionally only in
    the UTC hours [hour_from, hour_to) of each day. A change is a new row;
    a row already in effect is never edited, so re-running an old period
    prices it as it was priced then."""

    component = models.CharField(max_length=16, choices=CostComponent.choices)
    basis = models.CharField(max_length=16, choices=RateBasis.choices)
    amount = models.DecimalField(max_digits=24, decimal_places=9, validators=[MinValueValidator(0)])
    currency = models.CharField(max_length=3, default="USD", validators=[currency_validate])
    pool = models.ForeignKey(
        Pool, null=True, blank=True, on_delete=models.PROTECT, related_name="cost_rates"
    )
    hour_from = models.PositiveSmallIntegerField(default=0, validators=[MaxValueValidator(23)])
    hour_to = models.PositiveSmallIntegerField(default=24, validators=[MaxValueValidator(24)])
    effective_from = SupportedDateTimeField()
    effective_to = SupportedDateTimeField(null=True, blank=True)
    scenario = models.ForeignKey(
        CostScenario, null=True, blank=True, on_delete=models.CASCADE, related_name="rates"
    )
    note = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    # What a person sets (the rest is bookkeeping): admin, API and listings.
    INPUT_FIELDS = (
        "component",
        "basis",
        "amount",
        "currency",
        "pool",
        "hour_from",
        "hour_to",
        "effective_from",
        "effective_to",
        "scenario",
        "note",
    )

    class Meta:
        ordering = ["component", "pool_id", "-effective_from"]
        constraints = [
            models.CheckConstraint(condition=Q(amount__gte=0), name="rate_amount_nonnegative"),
            models.CheckConstraint(
                condition=Q(effective_to__isnull=True) | Q(effective_to__gt=F("effective_from")),
                name="rate_period_valid",
            ),
            models.CheckConstraint(
                condition=Q(hour_from__lt=F("hour_to"), hour_to__lte=24),
                name="rate_hours_valid",
            ),
        ]
        indexes = [models.Index(fields=["component", "effective_from"], name="rate_component")]

    def __str__(self) -> str:
        scope = self.pool.name if self.pool_id else "all pools"
        since = f"{self.effective_from:%Y-%m-%d}"
        return f"{self.component} {self.amount} {self.basis} ({scope}) from {since}"


class CostPeriodReopening(models.Model):
    """Finance reopened [start, end), inside the closed cost periods (those
    invoiced: billing.costs.closing), so dated cost rates may be entered
    there; who did, when and why stay on record."""

    start = SupportedDateTimeField()
    end = SupportedDateTimeField()
    reason = models.CharField(max_length=500)
    reopened_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    reopened_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-reopened_at"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="reopening_end_after"),
            models.CheckConstraint(condition=~Q(reason=""), name="reopening_has_reason"),
        ]

    def __str__(self) -> str:
        return f"{self.start:%Y-%m-%d} to {self.end:%Y-%m-%d} reopened: {self.reason}"


class AllocationRun(RunLifecycle):
    """One allocation of [start, end), booked or for a scenario: its status
    and progress (hours written of hours to do) for a person to watch. Each
    day is replaced in one transaction, so a run that dies leaves every day
    either as it was or as it should be, and re-running completes it."""

    scenario = models.ForeignKey(
        CostScenario, null=True, blank=True, on_delete=models.CASCADE, related_name="runs"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    hours_total = models.PositiveIntegerField(default=0)
    hours_done = models.PositiveIntegerField(default=0)
    warnings = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="run_end_after"),
            models.CheckConstraint(condition=Q(status__in=RunStatus.values), name="run_status"),
        ]

    def __str__(self) -> str:
        what = self.scenario.name if self.scenario_id else "booked"
        return f"{what} {self.start:%Y-%m-%d %H:00} .. {self.end:%Y-%m-%d %H:00} ({self.status})"

    @property
    def progress(self) -> float:  # ok-float: a progress fraction
        return self.hours_done / self.hours_total if self.hours_total else 0.0


class PoolHourCost(models.Model):
    """What one pool's GPUs cost in one hour, how busy they were, and how
    much of the cost was allocated to tenants: allocated + unallocated =
    total, exactly. A row with no pool holds GPUs no replica holds. Its
    tenants' CostAllocation rows are in its `currency`."""

    scenario = models.ForeignKey(
        CostScenario, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    hour = models.DateTimeField()
    pool = models.ForeignKey(Pool, null=True, **DERIVED)
    pool_kind = models.CharField(max_length=16, choices=PoolKind.choices, blank=True)
    gpus = models.PositiveIntegerField()
    fully_depreciated_gpus = models.PositiveIntegerField(default=0)
    capacity_seconds = models.DecimalField(**SECONDS)
    busy_seconds = models.DecimalField(**SECONDS)
    capital = models.DecimalField(**COST)
    energy = models.DecimalField(**COST)
    other_opex = models.DecimalField(**COST)
    total = models.DecimalField(**COST)
    allocated = models.DecimalField(**COST)
    unallocated = models.DecimalField(**COST)
    # The money columns' currency (the reporting currency when booked) and,
    # of cost entered in other currencies, what it was there and the rate
    # of the hour's day it was converted at: {"EUR": {"amount", "rate"}}.
    currency = models.CharField(max_length=3, default="USD")
    original = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-hour", "pool_id"]
        constraints = [
            models.UniqueConstraint(
                fields=["scenario", "hour", "pool"], name="poolhour_unique", nulls_distinct=False
            ),
            models.CheckConstraint(
                condition=Q(total=F("allocated") + F("unallocated")), name="poolhour_conserved"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.pool_id} @ {self.hour:%Y-%m-%d %H:00}: {self.total}"


class CostAllocation(models.Model):
    """The cost one tenant carries for one model in one pool and hour, by
    component: capital (depreciation or lease), energy and other opex of
    the device-seconds it used, and `idle` (its share of capacity nobody
    used: its own reservation or dedicated GPUs, or a shared pool's idle
    time spread pro rata). A row with no model carries idle cost of a
    tenant that used nothing that hour."""

    # No index of its own: reads go by period (the hour's BRIN index), and
    # booked rows, the many, all hold NULL here; an index cost a fifth of
    # each run's COPY (measured). Deleting a scenario scans its period.
    scenario = models.ForeignKey(
        CostScenario,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,
    )
    hour = models.DateTimeField()
    tenant = models.ForeignKey(Tenant, db_index=False, **DERIVED)
    pool = models.ForeignKey(Pool, db_index=False, **DERIVED)
    pool_kind = models.CharField(max_length=16, choices=PoolKind.choices)
    served_model = models.ForeignKey(ServedModel, null=True, db_index=False, **DERIVED)
    device_seconds = models.DecimalField(**SECONDS)
    capital = models.DecimalField(**COST)
    energy = models.DecimalField(**COST)
    other_opex = models.DecimalField(**COST)
    idle = models.DecimalField(**COST)
    total = models.DecimalField(**COST)

    class Meta:
        ordering = ["-hour", "tenant_id"]
        # One row per (book, hour, tenant, pool, model) holds by construction:
        # a day is replaced whole, in one transaction, by the one run holding
        # its book's lock, and allocation_conservation_check finds any break.
        # A unique index on five columns cost a third of each run's writes.
        constraints = [
            models.CheckConstraint(
                condition=Q(total=F("capital") + F("energy") + F("other_opex") + F("idle")),
                name="allocation_total",
            ),
        ]
        # Reads and day replacements are by period (finance only: tenants
        # never see cost). Rows arrive in hour order, so a BRIN index serves
        # them at almost no cost per write, where a B-tree cost each run ~20%.
        indexes = [BrinIndex(fields=["hour"], name="allocation_hour_brin")]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.pool_id} @ {self.hour:%Y-%m-%d %H:00}: {self.total}"
