"""The demo world's booked cost rates (used by `manage.py up`): a
peak / off-peak energy tariff, a PUE and the usual overheads, in force
from the start of 2026. Idempotent: a component already priced is left."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from billing.models import CostRate
from billing.rates import cost_rate_create

SINCE = datetime(2026, 1, 1, tzinfo=UTC)
DEMO_RATES = [
    {"component": "energy", "basis": "per_kwh", "amount": "0.09", "hour_from": 0, "hour_to": 7},
    {"component": "energy", "basis": "per_kwh", "amount": "0.16", "hour_from": 7, "hour_to": 21},
    {"component": "energy", "basis": "per_kwh", "amount": "0.09", "hour_from": 21, "hour_to": 24},
    {"component": "pue", "basis": "ratio", "amount": "1.3"},
    {"component": "colocation", "basis": "per_kw_month", "amount": "160"},
    {"component": "network", "basis": "per_gpu_month", "amount": "40"},
    {"component": "support", "basis": "per_gpu_month", "amount": "25"},
    {"component": "staff", "basis": "per_gpu_hour", "amount": "0.04"},
]


def cost_rates_demo_seed() -> int:
    priced = set(CostRate.objects.filter(scenario__isnull=True).values_list("component", flat=True))
    created = 0
    for rate in DEMO_RATES:
        if rate["component"] in priced:
            continue
        fields = {**rate, "amount": Decimal(rate["amount"])}
        cost_rate_create(effective_from=SINCE, note="demo", **fields)
        created += 1
    return created
