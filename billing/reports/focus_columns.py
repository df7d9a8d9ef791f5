"""The columns of the FOCUS 1.2 export (FinOps Open Cost and Usage
Specification, docs/focus.md): their order, which hold decimals, and how
values are written. Both datasets (billing.reports.focus for what tenants
are billed, billing.reports.focus_fleet for what the fleet costs) write
these columns, so a FinOps tool loads them into one table.

Nulls stay nulls (an empty CSV cell, a Parquet null), never "" or 0.
Custom columns come last, prefixed `x_`."""

from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal

from core.currencies import minor_exponent

FOCUS_COLUMNS = (
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    # Ours: "invoiced" (the row is a line of an issued invoice or a credit
    # note), "unbilled" (the period has no invoice yet: rated as it stands),
    # "cost" (the fleet's own cost, not billed to anyone).
    "x_BillingStatus",
)
DECIMAL_COLUMNS = frozenset(
    {
        "BilledCost",
        "CommitmentDiscountQuantity",
        "ConsumedQuantity",
        "ContractedCost",
        "ContractedUnitPrice",
        "EffectiveCost",
        "ListCost",
        "ListUnitPrice",
        "PricingQuantity",
    }
)
# Parquet's decimal places: a unit price (9 places) times a quantity (9
# places) is exact in 18.
DECIMAL_PLACES = 18

SERVICE_CATEGORY = "AI and Machine Learning"
ONE_PLACE = Decimal("0.1")
COMMITMENT_COLUMNS = tuple(c for c in FOCUS_COLUMNS if c.startswith("CommitmentDiscount"))


def focus_time(moment: datetime) -> str:
    """FOCUS date/time: UTC, to the second, with a Z."""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def focus_tags(tags: dict) -> str:
    """A flat key-value object, keys sorted; values as strings."""
    return json.dumps({k: str(v) for k, v in tags.items()}, sort_keys=True)


def focus_decimal(value: Decimal | None, currency: str | None = None) -> Decimal | None:
    """A decimal without trailing zeros, but with a decimal place: "6.0",
    not "6", which a reader inferring a CSV column's type takes for an
    integer where FOCUS requires a decimal; money in a currency without
    minor units stays whole (see focus_amount)."""
    return None if value is None else focus_amount(Decimal(value).normalize(), currency)


def focus_amount(value: Decimal, currency: str | None = None) -> Decimal:
    """An amount with its places (a billed "6.00" stays so), and at least
    one; but a whole amount of a `currency` without minor units (JPY) is
    written as its invoice has it: "500", not "500.0"."""
    if value.as_tuple().exponent < 0:
        return value
    whole = currency is not None and minor_exponent(currency) == 0
    return value.quantize(Decimal(1) if whole else ONE_PLACE)
