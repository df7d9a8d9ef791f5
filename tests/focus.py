"""Reading a FOCUS export back, and FOCUS 1.2's column rules checked on it
(docs/focus.md): presence, types, nullability, allowed values and the
relations between columns the spec states. The official validator runs on
the same files too (tests/billing/reports/test_focus_validator.py); these
checks run everywhere and also cover what it leaves to the data's owner."""

from __future__ import annotations

import io
import json
import re
from datetime import datetime
from decimal import Decimal

import pandas as pd
import pyarrow.parquet as pq

from billing.reports.focus_columns import DECIMAL_COLUMNS, FOCUS_COLUMNS

TIME_COLUMNS = ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd")
TIME_FORMAT = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
PLAIN_DECIMAL = re.compile(r"^-?\d+(\.\d+)?$")
NOT_NULL = (
    "BilledCost",
    "BillingAccountId",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeFrequency",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "ContractedCost",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ProviderName",
    "PublisherName",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
)
ALLOWED = {
    "ChargeCategory": {"Usage", "Purchase", "Tax", "Credit", "Adjustment"},
    "ChargeClass": {None, "Correction"},
    "ChargeFrequency": {"One-Time", "Recurring", "Usage-Based"},
    "PricingCategory": {None, "Standard", "Dynamic", "Committed", "Other"},
    "ServiceCategory": {"AI and Machine Learning"},
    "ServiceSubcategory": {"Generative AI", "Other (AI and Machine Learning)"},
}
NULL_TOGETHER = (
    ("PricingQuantity", "PricingUnit"),
    ("RegionId", "RegionName"),
    ("ResourceId", "ResourceType"),
    ("SubAccountId", "SubAccountName"),
)
PRICED_CATEGORIES = {"Usage", "Purchase"}
ISO_4217 = re.compile(r"^[A-Z]{3}$")
# FOCUS's unit format, for the units used here: "Tokens", "1000000 Tokens",
# "GPU-Hours" (a count unit, or a quantity of one, or one times a time unit).
UNIT = re.compile(r"^(\d+ )?[A-Za-z][A-Za-z0-9]*(-(Seconds|Hours|Days|Months|Years))?$")


def read_focus_csv(body: bytes) -> pd.DataFrame:
    """CSV as FOCUS means it: an empty cell is null; decimals exact; times
    checked for FOCUS's format, then parsed."""
    frame = pd.read_csv(io.BytesIO(body), dtype=str, keep_default_na=False)
    frame = frame.replace({"": None})
    for column in TIME_COLUMNS:
        bad = [v for v in frame[column] if v is not None and not TIME_FORMAT.match(v)]
        assert not bad, f"{column}: not YYYY-MM-DDTHH:mm:ssZ: {bad[:3]}"
    for column in DECIMAL_COLUMNS:
        bad = [v for v in frame[column] if v is not None and not PLAIN_DECIMAL.match(v)]
        assert not bad, f"{column}: not a plain decimal: {bad[:3]}"
    return _typed(frame)


def read_focus_parquet(body: bytes) -> pd.DataFrame:
    table = pq.read_table(io.BytesIO(body))
    for field in table.schema:
        expected = "decimal128(38, 18)" if field.name in DECIMAL_COLUMNS else "string"
        assert str(field.type) == expected, (field.name, field.type)
    frame = table.to_pandas().astype(object)
    frame = frame.where(frame.notna(), None)
    return _typed(frame)


def _typed(frame: pd.DataFrame) -> pd.DataFrame:
    """Decimals as Decimal (normalized, so CSV's "6.00" equals Parquet's
    6.000000000000000000) and times as datetimes; nulls as None."""
    frame = frame.copy()
    for column in DECIMAL_COLUMNS:
        frame[column] = [None if v is None else Decimal(v).normalize() for v in frame[column]]
    for column in TIME_COLUMNS:
        frame[column] = [
            None if v is None else datetime.fromisoformat(v.replace("Z", "+00:00"))
            for v in frame[column]
        ]
    return frame.astype(object).where(frame.notna(), None)


def focus_problems(frame: pd.DataFrame) -> list[str]:
    """Every broken rule, one line each (an empty list: the data conforms)."""
    problems: list[str] = []
    missing = [c for c in FOCUS_COLUMNS if c not in frame.columns]
    if missing:
        return [f"missing columns: {missing}"]
    custom = [c for c in frame.columns if c not in FOCUS_COLUMNS and not c.startswith("x_")]
    problems += [f"unknown column {c} (custom columns start x_)" for c in custom]
    for n, row in enumerate(frame.to_dict("records")):
        problems += [f"row {n}: {p}" for p in _row_problems(row)]
    return problems


def _row_problems(row: dict) -> list[str]:
    out = [f"{c} is null" for c in NOT_NULL if row[c] is None]
    for column, allowed in ALLOWED.items():
        if row[column] not in allowed:
            out.append(f"{column} {row[column]!r} not allowed")
    out += [f"{a} and {b} not null together" for a, b in NULL_TOGETHER if _one_null(row, a, b)]
    for unit in ("PricingUnit", "ConsumedUnit"):
        if row[unit] is not None and not UNIT.match(row[unit]):
            out.append(f"{unit} {row[unit]!r} is not in FOCUS's unit format")
    if not ISO_4217.match(row["BillingCurrency"] or ""):
        out.append(f"BillingCurrency {row['BillingCurrency']!r} is not ISO 4217")
    if row["BillingPeriodStart"] >= row["BillingPeriodEnd"]:
        out.append("billing period ends before it starts")
    if row["ChargePeriodStart"] >= row["ChargePeriodEnd"]:
        out.append("charge period ends before it starts")
    if row["ChargeCategory"] == "Purchase" and row["ChargeFrequency"] == "Usage-Based":
        out.append("a Purchase is not Usage-Based")
    if row["ChargeCategory"] != "Usage" and row["ConsumedQuantity"] is not None:
        out.append("ConsumedQuantity outside Usage")
    if (row["ConsumedQuantity"] is None) != (row["ConsumedUnit"] is None):
        out.append("ConsumedQuantity and ConsumedUnit not null together")
    correction = row["ChargeClass"] == "Correction"
    if row["ChargeCategory"] in PRICED_CATEGORIES and not correction:
        for column in ("PricingQuantity", "ListUnitPrice", "ContractedUnitPrice", "SkuId"):
            if row[column] is None:
                out.append(f"{column} is null on a {row['ChargeCategory']} row")
    for price in ("ListUnitPrice", "ContractedUnitPrice"):
        if row[price] is not None and row[price] < 0:
            out.append(f"{price} is negative")
    out += _cost_problems(row, correction)
    if row["Tags"] is not None:
        tags = json.loads(row["Tags"])
        if not isinstance(tags, dict) or any(isinstance(v, dict | list) for v in tags.values()):
            out.append("Tags is not a flat object")
    if row["CommitmentDiscountId"] is not None:
        out.append("a commitment discount where none exists")
    return out


def _cost_problems(row: dict, correction: bool) -> list[str]:
    out = []
    quantity = row["PricingQuantity"]
    for cost, price in (("ListCost", "ListUnitPrice"), ("ContractedCost", "ContractedUnitPrice")):
        if row[price] is None:
            if row["ChargeCategory"] not in PRICED_CATEGORIES and row[cost] != row["BilledCost"]:
                out.append(f"{cost} differs from BilledCost without a unit price")
        elif quantity is not None and not correction:
            product = row[price] * quantity
            if abs(product - row[cost]) > Decimal("1e-9") * max(abs(row[cost]), 1):
                out.append(f"{cost} {row[cost]} != {price} x PricingQuantity ({product})")
    return out


def _one_null(row: dict, a: str, b: str) -> bool:
    return (row[a] is None) != (row[b] is None)
