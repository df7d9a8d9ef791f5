"""Usage metered but not billed: tokens of a model that no price book in
force for the tenant's tier prices, decided stretch by stretch exactly as
rating decides it (rating leaves them out and warns). The reconciliation
page lists them beside the tokens vLLM served that were never metered."""

from __future__ import annotations

from datetime import datetime
from itertools import pairwise

from django.db.models import F, Max, Min, Sum

from billing.pricing.rating import price_books
from metering.models import UsageRollup
from serving.models import ServedModel
from tenants.choices import Tier


def unpriced_usage(*, start: datetime, end: datetime) -> list[dict]:
    """Per tenant and model: tokens, requests and the first and last hour
    of usage in [start, end) that nothing prices; the largest first."""
    found: dict[tuple[str, str], dict] = {}
    catalogue = set(ServedModel.objects.values_list("pk", flat=True))
    for tier in Tier.values:
        books = price_books(tier=tier, start=start, end=end)
        for since, until in pairwise([*sorted(books.edges(start, end)), end]):
            unpriced = catalogue - books.priced_models(books.at(since))
            if not unpriced:
                continue  # the usual case: no rollup needs reading
            rows = (
                UsageRollup.objects.filter(
                    hour__gte=since, hour__lt=until, tenant__tier=tier, served_model_id__in=unpriced
                )
                .values(tenant_slug=F("tenant__slug"), model=F("served_model__name"))
                .annotate(
                    tokens=Sum(F("prompt_tokens") + F("completion_tokens")),
                    requests=Sum(F("requests_ok") + F("requests_aborted") + F("requests_error")),
                    first_hour=Min("hour"),
                    last_hour=Max("hour"),
                )
                .filter(tokens__gt=0)
            )
            for row in rows:
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
