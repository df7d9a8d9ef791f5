"""Dated exchange rates, entered by finance staff or imported from a CSV of
reference rates (the ECB's, say): what margin reports use to turn revenue
billed in each tenant's currency into the platform's reporting currency."""

from __future__ import annotations

from decimal import Decimal

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from core.fields import CurrencyField, SupportedDateField

# At least 10 places: a rate is multiplied into nano-unit amounts.
FX_RATE = {"max_digits": 24, "decimal_places": 12}


class FxRate(models.Model):
    """One reference rate: on `date`, 1 `base` = `rate` `quote` (EUR/USD
    1.08 means one euro buys 1.08 dollars). One row per pair and day; the
    reverse pair and crosses are derived where needed (billing.fx)."""

    base = CurrencyField()
    quote = CurrencyField()
    date = SupportedDateField()
    rate = models.DecimalField(**FX_RATE)
    source = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["base", "quote", "-date"]
        verbose_name = "FX rate"
        constraints = [
            models.UniqueConstraint(fields=["base", "quote", "date"], name="fxrate_pair_date"),
            models.CheckConstraint(condition=Q(rate__gt=Decimal(0)), name="fxrate_positive"),
            models.CheckConstraint(
                condition=Q(base__regex=r"^[A-Z]{3}$", quote__regex=r"^[A-Z]{3}$"),
                name="fxrate_iso4217",
            ),
            models.CheckConstraint(condition=~Q(base=F("quote")), name="fxrate_two_currencies"),
        ]
        indexes = [models.Index(fields=["date"], name="fxrate_date")]

    def __str__(self) -> str:
        return f"{self.base}/{self.quote} {self.date:%Y-%m-%d} {self.rate.normalize():f}"
