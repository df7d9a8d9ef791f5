"""Tokens metered but not billed: usage of a model that no price book in
force for the tenant's tier prices. Rating leaves it out and says how many
tokens on the invoice; the reconciliation page lists it per tenant and
model, deciding hour by hour exactly as rating does."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

from billing.models import ModelPrice, PriceBook
from billing.pricing.unbilled import unpriced_usage
from tests.billing.conftest import charges_rate
from tests.factories import make_finance_user

PRICES = {
    "input_per_mtok": Decimal("1"),
    "cached_input_per_mtok": Decimal("0.25"),
    "output_per_mtok": Decimal("4"),
}


def test_usage_no_book_prices_is_listed_and_warned_about(world, client):
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    cut = now - timedelta(days=10)
    world.b.tier = "reserved"
    world.b.save(update_fields=["tier"])
    world.price(since=now - timedelta(days=60), until=cut)  # every tier, the model priced
    PriceBook.objects.create(name="list", version=2, effective_from=cut)  # prices nothing
    reserved = PriceBook.objects.create(name="reserved", tier="reserved", effective_from=cut)
    ModelPrice.objects.create(book=reserved, served_model=world.model, **PRICES)
    world.tokens(world.a, hour=cut - timedelta(days=5), prompt=9_000)  # priced by v1
    world.tokens(world.a, hour=now - timedelta(days=5), prompt=300, completion=200)
    world.tokens(world.a, hour=now - timedelta(days=4), prompt=250)
    world.tokens(world.b, hour=now - timedelta(days=5), prompt=7_000)  # its tier's book

    rows = unpriced_usage(start=now - timedelta(days=30), end=now)

    assert [(r["tenant_slug"], r["model"], r["tokens"]) for r in rows] == [
        (world.a.slug, "tiny", 750)
    ]
    assert (rows[0]["first_hour"], rows[0]["last_hour"]) == (
        now - timedelta(days=5),
        now - timedelta(days=4),
    )
    warnings: list[str] = []
    charges = charges_rate(
        tenant=world.a, start=now - timedelta(days=30), end=now, warnings=warnings
    )
    assert warnings == ["usage of tiny has no price: 750 tokens not billed"]
    assert sum(c.quantity for c in charges if c.kind == "tokens") == 9_000  # the rest, billed

    client.force_login(make_finance_user())
    html = client.get("/reconciliation/?days=30").content.decode()
    table = html.split('data-testid="unpriced"')[1].split("</table>")[0]
    assert world.a.slug in table and world.b.slug not in table
    assert 'data-testid="unpriced-total">750<' in table


def test_with_every_model_priced_nothing_is_listed(world, client):
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    world.price(since=now - timedelta(days=60))
    world.tokens(world.a, hour=now - timedelta(days=1), prompt=12_345)

    assert unpriced_usage(start=now - timedelta(days=7), end=now) == []
    client.force_login(make_finance_user())
    assert "Every metered token has a price." in client.get("/reconciliation/").content.decode()
