"""What the fleet costs the operator, as a FOCUS 1.2 dataset (finance
only): each GPU's cost per day, one row per cost component (capital:
depreciation or lease; energy; other opex), in the reporting currency,
from the allocation's cost model (billing.costs.gpu_days). The pool that
holds the GPU is in its Tags, so a FinOps tool groups by pool or by GPU.
Loaded beside the billing dataset (billing.reports.focus), it sets what
the GPUs cost against what tenants were billed.

Each row's PricingQuantity is the hours the GPU was in service that day;
its unit price is the cost per GPU-hour (to 18 places, so that unit price
times quantity is the cost within FOCUS's tolerance). `x_BillingStatus`
is "cost": nobody is invoiced for these rows."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from decimal import Decimal

from django.utils import timezone

from billing.costs.gpu_days import GpuDay, gpu_day_costs
from billing.fx import reporting_currency
from billing.invoicing.invoices import issuer_default
from billing.reports.focus_columns import (
    COMMITMENT_COLUMNS,
    DECIMAL_PLACES,
    SERVICE_CATEGORY,
    focus_decimal,
    focus_tags,
    focus_time,
)
from core.calendar import months_add
from serving.models import Pool

SERVICE_NAME = "GPU Fleet"
SERVICE_SUBCATEGORY = "Other (AI and Machine Learning)"
# (component, SKU meter, charge frequency)
COMPONENTS = (
    ("capital", "GPU capital (depreciation or lease)", "Recurring"),
    ("energy", "GPU energy", "Usage-Based"),
    ("other_opex", "GPU other opex", "Recurring"),
)
UNIT_PLACES = Decimal(1).scaleb(-DECIMAL_PLACES)
NO_POOL = "(no replica)"


def focus_fleet_rows(
    *, start: datetime, end: datetime, now: datetime | None = None
) -> Iterator[dict]:
    """Up to the hour now began: a cost not yet incurred is not exported.
    Cost entered in another currency than the reporting one is converted
    at the rate of its day (FxRateMissingError, before the first row, when
    there is none)."""
    now = now or timezone.now()
    hour = {"minute": 0, "second": 0, "microsecond": 0}
    end = min(end.astimezone(UTC).replace(**hour), now.astimezone(UTC).replace(**hour))
    currency = reporting_currency()
    operator = issuer_default().name
    pools = {p.pk: p for p in Pool.objects.all()}
    return (
        row
        for gpu_day in gpu_day_costs(start=start, end=end)
        for row in _rows(gpu_day, currency=currency, operator=operator, pools=pools)
    )


def _rows(gpu_day: GpuDay, *, currency: str, operator: str, pools: dict) -> Iterator[dict]:
    hours = focus_decimal(gpu_day.hours)
    month = gpu_day.start.replace(day=1, hour=0)
    pool = pools.get(gpu_day.pool_id)
    shared = {
        "BillingAccountId": "fleet",
        "BillingAccountName": f"{operator} GPU fleet",
        "BillingCurrency": currency,
        "BillingPeriodStart": focus_time(month),
        "BillingPeriodEnd": focus_time(months_add(month, 1)),
        "ChargeCategory": "Usage",
        "ChargeClass": None,
        "ChargePeriodStart": focus_time(gpu_day.start),
        "ChargePeriodEnd": focus_time(gpu_day.end),
        "ConsumedQuantity": hours,
        "ConsumedUnit": "GPU-Hours",
        "InvoiceId": None,
        "InvoiceIssuerName": operator,
        "PricingCategory": "Standard",
        "PricingQuantity": hours,
        "PricingUnit": "GPU-Hours",
        "ProviderName": operator,
        "PublisherName": operator,
        "RegionId": None,
        "RegionName": None,
        "ResourceId": f"gpu/{gpu_day.serial}",
        "ResourceName": gpu_day.serial,
        "ResourceType": "GPU",
        "ServiceCategory": SERVICE_CATEGORY,
        "ServiceName": SERVICE_NAME,
        "ServiceSubcategory": SERVICE_SUBCATEGORY,
        "SubAccountId": None,
        "SubAccountName": None,
        "Tags": focus_tags(
            {
                "pool": pool.name if pool else NO_POOL,
                "pool_kind": pool.kind if pool else "none",
            }
        ),
        "x_BillingStatus": "cost",
        **dict.fromkeys(COMMITMENT_COLUMNS),
    }
    for component, meter, frequency in COMPONENTS:
        cost = gpu_day.costs[component]
        if not cost:
            continue
        unit = focus_decimal((cost / hours).quantize(UNIT_PLACES), currency)
        sku = f"gpu-{component.replace('_', '-')}"
        yield {
            **shared,
            "BilledCost": focus_decimal(cost, currency),
            "EffectiveCost": focus_decimal(cost, currency),
            "ListCost": focus_decimal(cost, currency),
            "ContractedCost": focus_decimal(cost, currency),
            "ListUnitPrice": unit,
            "ContractedUnitPrice": unit,
            "ChargeDescription": f"{meter}, GPU {gpu_day.serial}",
            "ChargeFrequency": frequency,
            "SkuId": sku,
            "SkuMeter": meter,
            "SkuPriceId": f"{sku}/{gpu_day.serial}",
        }
