"""Usage as a FOCUS 1.2 cost-and-usage dataset (FinOps Open Cost and Usage
Specification): one row per period, tenant (sub-account), model, replica and
charge kind (input, cached input and output tokens, GPU-seconds).

The cost columns stay empty until billing rates the usage; BillingCurrency
is the tenant's. Tags name the pool and priority and, where requests in the
row recorded one, their time in the gateway's queue over the row's period:
the sum and mean in milliseconds (decimal strings) over the requests that
recorded one (`gateway_queue_requests`), and how many of them waited at
all (`gateway_queued_requests`)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta

from core.calendar import months_add
from core.fixed_point import fixed_point
from metering.selectors import UsageQuery, gateway_queue_ms_mean, usage_detail_rows
from tenants.models import Tenant

FOCUS_COLUMNS = (
    "BilledCost",
    "BillingCurrency",
    "ChargeCategory",
    "ChargeDescription",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "ConsumedQuantity",
    "ConsumedUnit",
    "EffectiveCost",
    "ListCost",
    "PricingUnit",
    "ResourceId",
    "ServiceName",
    "SkuId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
)
SERVICE_NAME = "LLM Inference"
# (charge kind, quantity, consumed unit, pricing unit)
CHARGE_KINDS = (
    ("input", lambda r: r["prompt_tokens"] - r["cached_tokens"], "Tokens", "1M Tokens"),
    ("cached-input", lambda r: r["cached_tokens"], "Tokens", "1M Tokens"),
    ("output", lambda r: r["completion_tokens"], "Tokens", "1M Tokens"),
    ("gpu-seconds", lambda r: r["device_seconds"], "GPU-Seconds", "GPU-Hours"),
)
PERIOD_LENGTH = {"hour": timedelta(hours=1), "day": timedelta(days=1)}


def _period_end(start, group_by: str):
    if group_by in PERIOD_LENGTH:
        return start + PERIOD_LENGTH[group_by]
    return months_add(start, 1)


def _iso(moment) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def focus_tags(usage: dict) -> str:
    """The Tags of one usage row (a JSON object, keys sorted)."""
    tags = {
        "pool": usage["pool__name"],
        "pool_kind": usage["pool__kind"],
        "priority": usage["priority"],
    }
    timed = usage["gateway_queue_requests"]
    if timed:
        total = usage["gateway_queue_ms_sum"]
        mean = gateway_queue_ms_mean(total_ms=total, requests=timed)
        tags |= {
            "gateway_queue_ms_sum": fixed_point(total),
            "gateway_queue_ms_mean": fixed_point(mean),
            "gateway_queue_requests": timed,
            "gateway_queued_requests": usage["gateway_queued_requests"],
        }
    return json.dumps(tags, sort_keys=True)


def focus_rows(*, tenant: Tenant | None, query: UsageQuery) -> Iterator[dict]:
    for usage in usage_detail_rows(tenant=tenant, query=query):
        model = usage["served_model__name"] or "unknown"
        tags = focus_tags(usage)
        for kind, quantity_of, unit, pricing_unit in CHARGE_KINDS:
            quantity = quantity_of(usage)
            if not quantity:
                continue
            yield {
                "BilledCost": "",
                "BillingCurrency": usage["tenant__billing_currency"],
                "ChargeCategory": "Usage",
                "ChargeDescription": f"{model} {kind}",
                "ChargePeriodEnd": _iso(_period_end(usage["period"], query.group_by)),
                "ChargePeriodStart": _iso(usage["period"]),
                "ConsumedQuantity": quantity,
                "ConsumedUnit": unit,
                "EffectiveCost": "",
                "ListCost": "",
                "PricingUnit": pricing_unit,
                "ResourceId": usage["replica__name"] or "",
                "ServiceName": SERVICE_NAME,
                "SkuId": f"{model}:{kind}",
                "SubAccountId": usage["tenant__slug"],
                "SubAccountName": usage["tenant__name"],
                "Tags": tags,
            }
