"""Where each tenant stands against its monthly budget in a billing period:
what it had spent at the last check, and when each threshold was crossed
(so each notification goes out once per period)."""

from __future__ import annotations

from django.db import models

from billing.money import COST
from tenants.models import Tenant


class BudgetState(models.Model):
    """One tenant's budget in one billing period [period_start, period_end)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budget_states")
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    budget = models.DecimalField(max_digits=20, decimal_places=4)
    spend = models.DecimalField(**COST)
    checked_at = models.DateTimeField()
    soft_notified_at = models.DateTimeField(null=True, blank=True)
    hard_reached_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-period_start"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "period_start"], name="budgetstate_period")
        ]

    def __str__(self) -> str:
        return f"{self.tenant} {self.period_start:%Y-%m-%d}: {self.spend} of {self.budget}"

    @property
    def percent(self) -> float:
        return float(self.spend / self.budget * 100) if self.budget else 0.0  # ok-float: display
