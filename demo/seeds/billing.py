"""The demo world's booked cost rates and prices (used by `manage.py up`):
a peak / off-peak energy tariff, a PUE and the usual overheads; price
books, plans, subscriptions, SLO policies and a credit grant; all in force from the
start of 2026; demo FX rates (Initech and Umbrella bill in EUR); and tax
(an Irish issuer, VAT rates, two EU tenants' tax profiles).
Idempotent: what is already there is left."""

from __future__ import annotations

import math
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

from django.conf import settings

from billing.costs.rates import cost_rate_create
from billing.invoicing.invoices import issuer_default
from billing.models import (
    CostRate,
    CreditGrant,
    FxRate,
    Issuer,
    ModelPrice,
    Plan,
    PriceBook,
    SlaCreditRule,
    SloPolicy,
    Subscription,
    TaxProfile,
    TaxRate,
    VolumeTier,
)
from billing.tax.services import tax_profile_set, tax_rate_create

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


# Units per euro around which the demo's rates wander (plausible levels, not
# real rates), ECB style: base EUR, business days only, 4 places.
DEMO_FX_LEVELS = {"USD": 1.08, "GBP": 0.85, "CHF": 0.95, "JPY": 162.0}  # ok-float: demo knobs
DEMO_FX_SOURCE = "demo: synthetic, not a real rate"


def fx_rate_demo(quote: str, day: date) -> Decimal:
    """The demo's EUR/`quote` rate on `day`: the same every run (two slow
    waves around the level, within about 3 %)."""
    n = day.toordinal()
    # ok-float: a generator's wave, turned into a 4-place Decimal once
    wave = 0.025 * math.sin(2 * math.pi * n / 120) + 0.006 * math.sin(2 * math.pi * n / 9)
    places = Decimal("0.01") if DEMO_FX_LEVELS[quote] > 50 else Decimal("0.0001")
    return Decimal(repr(DEMO_FX_LEVELS[quote] * (1 + wave))).quantize(places)


def fx_rates_demo_seed(*, start: date | None = None, end: date | None = None) -> int:
    """Demo EUR rates for each business day of [start, end] (default: the
    start of 2026 to today, UTC) against the reporting currency and the
    demo tenants' currencies, marked as demo rates. Days already holding a
    rate are left. Returns rows created."""
    from tenants.models import Tenant

    start = start or SINCE.date()
    end = end or datetime.now(UTC).date()
    wanted = {
        settings.REPORTING_CURRENCY,
        *Tenant.objects.values_list("billing_currency", flat=True),
    }
    quotes = sorted(c for c in wanted if c in DEMO_FX_LEVELS)
    if "EUR" not in wanted or not quotes:
        return 0
    rows, day = [], start
    while day <= end:
        if day.weekday() < 5:
            rows += [
                FxRate(
                    base="EUR", quote=q, date=day, rate=fx_rate_demo(q, day), source=DEMO_FX_SOURCE
                )
                for q in quotes
            ]
        day += timedelta(days=1)
    before = FxRate.objects.count()
    FxRate.objects.bulk_create(rows, ignore_conflicts=True, batch_size=2000)
    return FxRate.objects.count() - before


def prices_demo_seed() -> int:
    """The demo's prices, once: a list book for every tier, a dedicated
    book with a GPU-month fee, a reservation fee, graduated output tokens;
    a committed plan for the dedicated and reserved tenants, a discount
    plan and prepaid credit for a shared one; SLO policies with credit
    schedules. Returns rows created."""
    from serving.models import ServedModel
    from serving.tiny_model import MODEL_NAME
    from tenants.models import Tenant

    if PriceBook.objects.filter(name="Demo list").exists():
        return 0
    model, _ = ServedModel.objects.get_or_create(name=MODEL_NAME)
    created = 0
    for tier, fees in (
        ("", {"reservation_per_gpu_hour": Decimal("1.20")}),
        ("dedicated", {"dedicated_per_gpu_month": Decimal("1450")}),
    ):
        book = PriceBook.objects.create(
            name="Demo list" if not tier else "Demo dedicated",
            tier=tier,
            effective_from=SINCE,
            **fees,
        )
        price = ModelPrice.objects.create(
            book=book,
            served_model=model,
            input_per_mtok=Decimal("0.20"),
            cached_input_per_mtok=Decimal("0.05"),
            output_per_mtok=Decimal("0.80"),
            per_gpu_second=Decimal("0.0002") if tier else None,
        )
        VolumeTier.objects.bulk_create(
            VolumeTier(model_price=price, kind="output", from_tokens=start, per_mtok=per)
            for start, per in ((0, Decimal("0.80")), (10_000_000, Decimal("0.60")))
        )
        created += 2
    committed = Plan.objects.create(
        name="Committed", minimum_commit=Decimal("500"), discount_percent=Decimal("10")
    )
    starter = Plan.objects.create(name="Starter", discount_percent=Decimal("5"))
    created += slo_policies_demo_create(committed=committed)
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in=["acme", "globex", "hooli"])}
    for slug, plan in (("acme", committed), ("globex", committed), ("hooli", starter)):
        if slug in tenants:
            Subscription.objects.create(tenant=tenants[slug], plan=plan, start=SINCE)
            created += 1
    if "hooli" in tenants:
        CreditGrant.objects.create(
            tenant=tenants["hooli"],
            amount=Decimal("50"),
            granted_at=SINCE,
            expires_at=datetime(2027, 1, 1, tzinfo=UTC),
            note="welcome credit",
        )
        created += 1
    return created + 2


# What the demo's embedding model (tiny-embed) costs per million input
# tokens: embeddings generate nothing, so they are priced by input alone.
DEMO_EMBED_PER_MTOK = Decimal("0.02")


def embed_prices_demo_seed() -> int:
    """tiny-embed's price in each demo book that has none yet (a tenant with
    a budget or prepaid credit may call only priced models). Returns rows
    created."""
    from serving.models import ServedModel
    from serving.tiny_model import EMBEDDING_MODEL_NAME

    model = ServedModel.objects.filter(name=EMBEDDING_MODEL_NAME).first()
    if model is None:
        return 0
    created = 0
    for book in PriceBook.objects.filter(name__in=["Demo list", "Demo dedicated"]):
        _, made = ModelPrice.objects.get_or_create(
            book=book,
            served_model=model,
            defaults={
                "input_per_mtok": DEMO_EMBED_PER_MTOK,
                "cached_input_per_mtok": DEMO_EMBED_PER_MTOK,
                "output_per_mtok": Decimal(0),
            },
        )
        created += made
    return created


# (name, tier or None, plan, availability %, TTFT p95 ms, inter-token p95 ms)
DEMO_SLOS = [
    ("Shared default", "shared", None, "99.5", "2000", "250"),
    ("Reserved default", "reserved", None, "99.9", "1000", "150"),
    ("Dedicated default", "dedicated", None, "99.9", "1000", "150"),
    ("Committed", None, "Committed", "99.9", "800", "120"),
]


def slo_policies_demo_create(*, committed: Plan) -> int:
    """Each tier's default SLOs and the Committed plan's own, each with a
    credit schedule: availability under target 10 %, under 99 % 25 %;
    TTFT or inter-token p95 over target 5 % each; at most 30 % a period."""
    created = 0
    for name, tier, plan, availability, ttft, itl in DEMO_SLOS:
        policy = SloPolicy.objects.create(
            name=name,
            tier=tier or "",
            plan=committed if plan else None,
            availability_percent=Decimal(availability),
            ttft_p95_ms=Decimal(ttft),
            itl_p95_ms=Decimal(itl),
            credit_cap_percent=Decimal("30"),
        )
        steps = [
            ("availability", None, "10"),
            ("availability", Decimal("99"), "25"),
            ("ttft_p95", None, "5"),
            ("itl_p95", None, "5"),
        ]
        SlaCreditRule.objects.bulk_create(
            SlaCreditRule(policy=policy, metric=m, threshold=t, credit_percent=Decimal(c))
            for m, t, c in steps
        )
        created += 1 + len(steps)
    return created


# The demo's issuer is established in Ireland. Initech (Germany) gives its
# VAT id: reverse-charged. Umbrella (France) gives none: France's VAT. The
# US tenants have no tax profile: not taxed (no rate for the US).
DEMO_ISSUER = {"country": "IE", "tax_id": "IE6388047V", "address": "1 Demo Quay\nDublin 2"}
DEMO_TAX_RATES = [
    {"country": "IE", "name": "VAT", "percent": "23", "valid_from": "2012-01-01"},
    {"country": "FR", "name": "VAT", "percent": "20", "valid_from": "2014-01-01"},
    {"country": "DE", "name": "VAT", "percent": "19", "valid_from": "2021-01-01"},
]
DEMO_TAX_PROFILES = {
    "initech": {"country": "DE", "tax_id": "DE123456789"},
    "umbrella": {"country": "FR"},
}


def tax_demo_seed() -> int:
    """The demo's issuer country, tax rates and tenants' tax profiles: how
    many rows were added (0 on a second run)."""
    from tenants.models import Tenant

    added = 0
    issuer = issuer_default()
    if not issuer.country:
        Issuer.objects.filter(pk=issuer.pk).update(**DEMO_ISSUER)
    for rate in DEMO_TAX_RATES:
        if not TaxRate.objects.filter(country=rate["country"]).exists():
            tax_rate_create(**rate)
            added += 1
    for slug, profile in DEMO_TAX_PROFILES.items():
        tenant = Tenant.objects.filter(slug=slug).first()
        if tenant is not None and not TaxProfile.objects.filter(tenant=tenant).exists():
            tax_profile_set(tenant=tenant, **profile)
            added += 1
    return added
