"""Rating worked out by hand: flat prices with cached tokens, graduated
volume tiers, a price change mid-month, GPU-seconds, reservation and
dedicated fees, a plan's discount and commitment true-up."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given
from hypothesis import strategies as st

from billing.models import Plan, Subscription, VolumeTier
from billing.pricing.rate_card import TOKEN_KINDS, RateCard, usage_amount, usage_nanos
from tests.billing.conftest import NOV, OCT, charges_rate

D = Decimal


def _total(charges) -> Decimal:
    return sum((c.amount for c in charges), D(0))


def test_flat_prices_with_cached_tokens(world):
    world.price()
    world.tokens(
        world.a,
        hour=OCT + timedelta(hours=5),
        prompt=1_500_000,
        cached=500_000,
        completion=250_000,
    )
    world.tokens(world.b, hour=OCT + timedelta(hours=5), prompt=9_000_000)  # not Alpha's

    charges = {c.token_kind: c for c in charges_rate(tenant=world.a, start=OCT, end=NOV)}

    # 1 M uncached input at $1/M, 0.5 M cached at $0.25/M, 0.25 M output at $4/M.
    assert charges["input"].quantity == 1_000_000 and charges["input"].amount == D("1")
    assert charges["cached_input"].amount == D("0.125")
    assert charges["output"].amount == D("1")
    assert _total(charges.values()) == D("2.125")


def test_graduated_output_tiers_count_the_month_volume(world):
    price = world.price()
    for start, per_mtok in ((0, "4"), (1_000_000, "3"), (5_000_000, "2")):
        VolumeTier.objects.create(
            model_price=price, kind="output", from_tokens=start, per_mtok=D(per_mtok)
        )
    world.tokens(world.a, hour=OCT + timedelta(hours=1), completion=800_000)
    world.tokens(world.a, hour=OCT + timedelta(days=3), completion=4_700_000)

    output = [
        c for c in charges_rate(tenant=world.a, start=OCT, end=NOV) if c.token_kind == "output"
    ]

    # 0.8 M + 0.2 M at $4, then 4 M at $3, then the last 0.5 M at $2.
    assert {(c.quantity, c.unit_price) for c in output} == {
        (D(1_000_000), D(4)),
        (D(4_000_000), D(3)),
        (D(500_000), D(2)),
    }
    assert _total(output) == D("17")
    # Each line names its tier, as the invoice and Stripe show it.
    assert {c.description for c in output} == {
        "tiny: output tokens, tier 1 (first 1M)",
        "tiny: output tokens, tier 2 (1M to 5M)",
        "tiny: output tokens, tier 3 (above 5M)",
    }


def test_one_requests_price_is_what_it_adds_to_the_periods_rating(world):
    """The gateway prices a request with `usage_amount` after the period's
    volume so far; rating the period with and without that request's usage
    must differ by exactly that amount, across a tier boundary, with cached
    tokens and GPU-seconds."""
    price = world.price(per_gpu_second=D("0.0002"))
    for start, per_mtok in ((0, "4"), (1_000_000, "3")):
        VolumeTier.objects.create(
            model_price=price, kind="output", from_tokens=start, per_mtok=D(per_mtok)
        )
    world.tokens(world.a, hour=OCT + timedelta(hours=1), prompt=300_000, completion=999_990)
    before = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))

    amount = usage_amount(
        RateCard.of(price),
        done={"input": 300_000, "cached_input": 0, "output": 999_990},
        prompt=1_000,
        cached=400,
        completion=30,  # 10 at $4/M, 20 at $3/M
        gpu_seconds=D("2.5"),
    )
    world.tokens(
        world.a,
        hour=OCT + timedelta(hours=2),
        prompt=1_000,
        cached=400,
        completion=30,
        seconds=D("2.5"),
    )
    after = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))

    by_hand = (600 * D(1) + 400 * D("0.25") + 10 * D(4) + 20 * D(3)) / 1_000_000 + D("2.5") * D(
        "0.0002"
    )
    assert amount == by_hand == after - before


def test_a_flat_cards_request_price_is_what_it_adds_to_the_periods_rating(world):
    """A card without tiers takes usage_amount's quick path, never walking
    card_pieces as rating does: the two must still agree to the last digit,
    with prices of many decimals and the cached part of a prompt."""
    price = world.price(
        input_per_mtok=D("0.333333"),
        cached_input_per_mtok=D("0.0777777"),
        output_per_mtok=D("1.999999"),
        per_gpu_second=D("0.000123"),
    )
    card = RateCard.of(price)
    assert card.flat == (D("0.333333"), D("0.0777777"), D("1.999999"))
    world.tokens(world.a, hour=OCT + timedelta(hours=1), prompt=7_777, completion=3)
    before = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))
    amount = usage_amount(
        card, done={}, prompt=1_234, cached=321, completion=77, gpu_seconds=D("0.7")
    )
    world.tokens(
        world.a,
        hour=OCT + timedelta(hours=2),
        prompt=1_234,
        cached=321,
        completion=77,
        seconds=D("0.7"),
    )
    after = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))
    by_hand = (913 * D("0.333333") + 321 * D("0.0777777") + 77 * D("1.999999")) / 1_000_000 + D(
        "0.7"
    ) * D("0.000123")
    assert amount == by_hand == after - before


def test_a_flat_cards_request_in_nano_units_is_what_it_adds_to_the_periods_rating(world):
    """The gateway holds and settles a flat card of whole nano-unit prices
    in integers (`usage_nanos`): the figure must be the period's rating's
    difference exactly, in nano-units; a card with a finer price has none."""
    price = world.price(
        input_per_mtok=D("0.125"), cached_input_per_mtok=D("0.031"), output_per_mtok=D("2.5")
    )
    card = RateCard.of(price)
    assert card.flat_nanos == (125, 31, 2500)
    world.tokens(world.a, hour=OCT + timedelta(hours=1), prompt=7_777, completion=3)
    before = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))
    units = usage_nanos(card, prompt=1_234, cached=321, completion=77)
    world.tokens(world.a, hour=OCT + timedelta(hours=2), prompt=1_234, cached=321, completion=77)
    after = _total(charges_rate(tenant=world.a, start=OCT, end=NOV))
    assert units == 913 * 125 + 321 * 31 + 77 * 2500
    assert D(units).scaleb(-9) == after - before
    finer = RateCard(steps={**card.steps, "output": ((0, D("2.5001")),)})
    assert finer.flat_nanos is None
    assert usage_nanos(finer, prompt=1, completion=1) is None


@given(
    prices=st.tuples(*[st.decimals(0, 1000, places=3)] * 3),
    prompt=st.integers(-5, 10**9),
    cached=st.integers(-5, 10**9),
    completion=st.integers(-5, 10**9),
)
def test_nano_units_and_the_decimal_amount_agree_to_the_last_digit(
    prices, prompt, cached, completion
):
    steps = {kind: ((0, price),) for kind, price in zip(TOKEN_KINDS, prices, strict=True)}
    card = RateCard(steps=steps)
    units = usage_nanos(card, prompt=prompt, cached=cached, completion=completion)
    amount = usage_amount(card, done={}, prompt=prompt, cached=cached, completion=completion)
    assert D(units).scaleb(-9) == amount


def test_a_price_change_mid_month_prices_each_hour_by_its_book(world):
    world.price(version=1, until=datetime(2026, 10, 15, tzinfo=UTC))
    world.price(version=2, since=datetime(2026, 10, 15, tzinfo=UTC), output_per_mtok=D("2"))
    world.tokens(world.a, hour=datetime(2026, 10, 10, tzinfo=UTC), completion=1_000_000)
    world.tokens(world.a, hour=datetime(2026, 10, 20, tzinfo=UTC), completion=1_000_000)

    output = [
        c for c in charges_rate(tenant=world.a, start=OCT, end=NOV) if c.token_kind == "output"
    ]

    assert sorted((c.book, c.amount) for c in output) == [("list v1", D(4)), ("list v2", D(2))]


def test_a_price_change_mid_day_prices_the_hours_on_each_side_by_their_book(world):
    """Whole days are rated from their daily totals, the day the price
    changes from its hours: the hour before the change and the hour it
    starts land in different books."""
    change = datetime(2026, 10, 15, 15, tzinfo=UTC)
    world.price(version=1, until=change)
    world.price(version=2, since=change, output_per_mtok=D("2"))
    for hour in (
        datetime(2026, 10, 14, 23, tzinfo=UTC),  # a whole day before
        change - timedelta(hours=1),
        change,
        datetime(2026, 10, 16, 0, tzinfo=UTC),  # a whole day after
    ):
        world.tokens(world.a, hour=hour, completion=1_000_000)
    world.tokens(world.b, hour=change, completion=1_000_000)  # another tenant's, not a's

    output = [
        c for c in charges_rate(tenant=world.a, start=OCT, end=NOV) if c.token_kind == "output"
    ]

    assert sorted((c.book, c.quantity, c.amount) for c in output) == [
        ("list v1", 2_000_000, D(8)),
        ("list v2", 2_000_000, D(4)),
    ]


def test_of_two_books_left_in_force_together_the_later_one_prices(world):
    """A new list put in force without closing the one before: from its
    first moment it prices, not whichever book was loaded first."""
    from billing.models import ModelPrice, PriceBook

    world.price(version=1)  # "list", in force since October 1st, open-ended
    autumn = PriceBook.objects.create(
        name="autumn list", tier="", effective_from=datetime(2026, 10, 15, tzinfo=UTC)
    )
    ModelPrice.objects.create(
        book=autumn,
        served_model=world.model,
        input_per_mtok=D(1),
        cached_input_per_mtok=D("0.25"),
        output_per_mtok=D(2),
    )
    world.tokens(world.a, hour=datetime(2026, 10, 10, tzinfo=UTC), completion=1_000_000)
    world.tokens(world.a, hour=datetime(2026, 10, 20, tzinfo=UTC), completion=1_000_000)

    output = [
        c for c in charges_rate(tenant=world.a, start=OCT, end=NOV) if c.token_kind == "output"
    ]

    priced = sorted((c.book, c.amount) for c in output)
    assert priced == [("autumn list v1", D(2)), ("list v1", D(4))]


def test_gpu_seconds_reservations_and_dedicated_gpus(world):
    world.price(per_gpu_second=D("0.0002"), reservation=D("1.5"), dedicated=D("720"))
    world.tokens(world.a, hour=OCT + timedelta(hours=2), seconds=1800)
    reserved = world.pool("res-a", kind="reserved", owner=world.a)
    world.reserve(world.a, reserved, 2, start=NOV - timedelta(hours=10))  # 10 h in October
    dedicated = world.pool("ded-a", kind="dedicated", owner=world.a)
    world.replica("ded-r", dedicated, [world.gpu("d1"), world.gpu("d2")])

    by_kind = {c.kind: c for c in charges_rate(tenant=world.a, start=OCT, end=NOV)}

    assert by_kind["gpu_seconds"].amount == D("0.36")  # 1,800 s x $0.0002
    assert by_kind["reservation"].quantity == 20 and by_kind["reservation"].amount == D("30")
    # Two GPUs for all of October: two GPU-months at $720.
    assert by_kind["dedicated"].amount == D("1440")
    assert by_kind["dedicated"].quantity == 2


def test_a_plan_discounts_usage_and_tops_up_to_its_commitment(world):
    world.price(output_per_mtok=D("10"))
    plan = Plan.objects.create(name="Growth", minimum_commit=D("100"), discount_percent=D("10"))
    Subscription.objects.create(tenant=world.a, plan=plan, start=OCT - timedelta(days=40))
    world.tokens(world.a, hour=OCT + timedelta(hours=1), completion=5_000_000)  # $50

    charges = {c.kind: c for c in charges_rate(tenant=world.a, start=OCT, end=NOV)}
    assert charges["discount"].amount == D("-5")
    assert charges["commit_true_up"].amount == D("55")
    assert _total(charges.values()) == D("100")

    world.tokens(world.a, hour=OCT + timedelta(hours=2), completion=15_000_000)  # $150 more
    charges = charges_rate(tenant=world.a, start=OCT, end=NOV)
    assert "commit_true_up" not in {c.kind for c in charges}
    assert _total(charges) == D("180")  # $200 less 10%
