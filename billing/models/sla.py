"""Service levels: what a plan (or, by default, a tier) promises, the
service credits it owes when a billing period misses it, and finance's
decisions on those credits. Compliance itself is measured from the ledger
(billing.sla.compliance); a credit becomes a line on the period's invoice
(billing.invoicing.sla_credits)."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q

from billing.choices import SlaAdjustmentAction, SloMetric
from billing.models.prices import Plan
from tenants.choices import Tier
from tenants.models import Tenant

PERCENT = {
    "max_digits": 5,
    "decimal_places": 2,
    "validators": [MinValueValidator(0), MaxValueValidator(100)],
}
MILLIS = {"max_digits": 12, "decimal_places": 3, "validators": [MinValueValidator(0)]}


class SloPolicy(models.Model):
    """The SLO targets of one plan, or of one tier (the default for tenants
    whose plan names none), and the cap on the credits of one period. A
    target left empty is not promised. Latencies are p95 in milliseconds,
    availability a percent of requests (billing.sla.compliance says how
    each is measured)."""

    name = models.CharField(max_length=100, unique=True)
    plan = models.OneToOneField(
        Plan, null=True, blank=True, on_delete=models.CASCADE, related_name="slo_policy"
    )
    tier = models.CharField(
        max_length=16,
        choices=Tier.choices,
        blank=True,
        default="",
        help_text="For tenants of this tier whose plan has no policy; empty for a plan's.",
    )
    ttft_p95_ms = models.DecimalField(**MILLIS, null=True, blank=True)
    itl_p95_ms = models.DecimalField(**MILLIS, null=True, blank=True)
    availability_percent = models.DecimalField(
        max_digits=7,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0), MaxValueValidator(100)],
    )
    credit_cap_percent = models.DecimalField(
        **PERCENT, default=100, help_text="The most one period's credits add up to."
    )

    class Meta:
        verbose_name_plural = "SLO policies"
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=(Q(plan__isnull=False) & Q(tier=""))
                | (Q(plan__isnull=True) & ~Q(tier="")),
                name="slopolicy_plan_or_tier",
            ),
            models.UniqueConstraint(
                fields=["tier"], condition=Q(plan__isnull=True), name="slopolicy_one_per_tier"
            ),
            models.CheckConstraint(
                condition=Q(credit_cap_percent__gte=0, credit_cap_percent__lte=100),
                name="slopolicy_cap_percent",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def target(self, metric: str):
        """The policy's target for `metric` (None: not promised)."""
        return {
            SloMetric.AVAILABILITY: self.availability_percent,
            SloMetric.TTFT_P95: self.ttft_p95_ms,
            SloMetric.ITL_P95: self.itl_p95_ms,
        }[SloMetric(metric)]


class SlaCreditRule(models.Model):
    """One step of a policy's credit schedule: a period whose `metric`
    misses `threshold` earns `credit_percent` of its usage charges.
    Availability misses below the threshold (a percent), latencies above
    it (ms); an empty threshold is the policy's target. Per metric the
    highest-paying step that matches counts; metrics add up, to the cap."""

    policy = models.ForeignKey(SloPolicy, on_delete=models.CASCADE, related_name="credit_rules")
    metric = models.CharField(max_length=16, choices=SloMetric.choices)
    threshold = models.DecimalField(
        max_digits=12,
        decimal_places=4,
        null=True,
        blank=True,
        validators=[MinValueValidator(0)],
        help_text="Empty: the policy's target for the metric.",
    )
    credit_percent = models.DecimalField(**PERCENT)

    class Meta:
        ordering = ["policy", "metric", "-credit_percent"]
        constraints = [
            models.UniqueConstraint(
                fields=["policy", "metric", "threshold"],
                name="slacreditrule_unique",
                nulls_distinct=False,
            ),
            models.CheckConstraint(
                condition=Q(metric__in=SloMetric.values), name="slacreditrule_metric_valid"
            ),
            models.CheckConstraint(
                condition=Q(credit_percent__gt=0, credit_percent__lte=100),
                name="slacreditrule_percent",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.policy}: {self.metric} -> {self.credit_percent}%"


class SlaCreditAdjustment(models.Model):
    """Finance's decision on one SLA credit of a tenant's billing period:
    waive it, or credit `credit_percent` of the usage charges instead of
    what the schedule says; who, when and why. A ledger of decisions,
    never edited: the newest row for (tenant, period, metric) is what the
    period's invoice applies. Made only while that invoice is a draft (a
    finalized invoice never changes: correct it with a credit note)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="+")
    period_start = models.DateTimeField()
    metric = models.CharField(max_length=16, choices=SloMetric.choices)
    action = models.CharField(max_length=16, choices=SlaAdjustmentAction.choices)
    credit_percent = models.DecimalField(**PERCENT, null=True, blank=True)
    reason = models.CharField(max_length=300)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-pk"]
        indexes = [models.Index(fields=["tenant", "period_start"], name="slaadjust_period")]
        constraints = [
            models.CheckConstraint(
                condition=Q(metric__in=SloMetric.values), name="slaadjust_metric_valid"
            ),
            models.CheckConstraint(
                condition=(Q(action=SlaAdjustmentAction.WAIVE) & Q(credit_percent__isnull=True))
                | (
                    Q(action=SlaAdjustmentAction.ADJUST)
                    & Q(credit_percent__gte=0, credit_percent__lte=100)
                ),
                name="slaadjust_action_percent",
            ),
            models.CheckConstraint(condition=~Q(reason=""), name="slaadjust_reason"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id} {self.period_start:%Y-%m-%d} {self.metric}: {self.action}"
