"""Usage metered but not billed: tokens of a model that no price book in
force for the tenant's tier prices, decided stretch by stretch exactly as
rating decides it (rating leaves them out and warns). The reconciliation
page lists them beside the tokens vLLM served that were never metered."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise, product

from billing.pricing.rating import price_books
from metering.selectors.rating import usage_of_models_by_tenant
from serving.models import ServedModel
from tenants.choices import Tier
from tenants.models import Tenant


def unpriced_usage(*, start: datetime, end: datetime) -> list[dict]:
    """Per tenant and model: tokens, requests and the first and last hour
    of usage in [start, end) that nothing prices; the largest first."""
    found: dict[tuple[str, str], dict] = {}
    catalogue = set(ServedModel.objects.values_list("pk", flat=True))
    # Which book is in force depends on the tier and the tenant's currency.
    billed_in = dict(Tenant.objects.values_list("slug", "billing_currency"))
    for tier, currency in product(Tier.values, sorted(set(billed_in.values()))):
        books = price_books(tier=tier, currency=currency, start=start, end=end)
        for since, until in pairwise([*sorted(books.edges(start, end)), end]):
            unpriced = catalogue - books.priced_models(books.at(since))
            if not unpriced:
                continue  # the usual case: no rollup needs reading
            rows = usage_of_models_by_tenant(start=since, end=until, tier=tier, model_ids=unpriced)
            for row in rows:
                if billed_in.get(row["tenant_slug"]) != currency:
                    continue
                key = (row["tenant_slug"], row["model"])
                if key not in found:
                    found[key] = row
                    continue
                seen = found[key]
                seen["tokens"] += row["tokens"]
                seen["requests"] += row["requests"]
                seen["first_hour"] = min(seen["first_hour"], row["first_hour"])
                seen["last_hour"] = max(seen["last_hour"], row["last_hour"])
    return sorted(found.values(), key=lambda r: (-r["tokens"], r["tenant_slug"], r["model"]))
