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
    def percent(self) -> float:  # ok-float: a percentage, shown
        return float(self.spend / self.budget * 100) if self.budget else 0.0  # ok-float: display


class SpendCorrection(models.Model):
    """The ledger's word on one of the gateway's fast spend accounts (a
    budget's period, a prepaid balance's unbilled usage) up to `cut`, an hour
    boundary: the spend of the usage received before it. The correction job
    writes it; the gateway replaces the account's count of that usage with
    it, and records by how much the two differed (`drift`: the counter less
    the ledger, so positive means the gateway had counted more)."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="spend_corrections")
    account = models.CharField(max_length=80)  # billing.spend.terms.account_key
    kind = models.CharField(max_length=16)  # budget | prepaid
    cut = models.DateTimeField()
    ledger = models.DecimalField(**COST)
    created_at = models.DateTimeField(auto_now_add=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    drift = models.DecimalField(**COST, null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-cut"]
        constraints = [
            models.UniqueConstraint(fields=["account", "cut"], name="spendcorrection_cut")
        ]

    def __str__(self) -> str:
        return f"{self.account} to {self.cut:%Y-%m-%d %H:%M}: {self.ledger}"
