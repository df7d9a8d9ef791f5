"""Finance manages its own prices through the API (issue 59, items 3 and 6):
a price book version in force is never edited (409: create a new version
from a date); a new version from a date closes the one it supersedes
there and prices only usage from then on; a version dated before the
current hour or into an invoiced (closed) period is a 409 naming
effective_from. Books in USD and JPY; a tenant's members and keys are
refused (403). Every write is in the audit trail with who made it.

The suite's clock is 2026-11-28 10:30 UTC (tests/conftest.py); October is
invoiced for two tenants (the `issued` fixture), so it is closed."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from audit.models import AuditEntry
from billing.errors import PriceVersionInForceError
from billing.invoicing.invoices import invoice_draft_build
from billing.models import ModelPrice, PriceBook, VolumeTier
from tenants.choices import Role
from tests.billing.conftest import NOV
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key, make_member, make_tenant

BOOKS = "/api/v1/price-books"
DEC = datetime(2026, 12, 1, tzinfo=UTC)
D = Decimal


@pytest.fixture
def fran(db):
    return make_finance_user(username="fran")


@pytest.fixture
def finance(fran):
    return client_for_user(fran)


def _version(name="list", since="2026-12-01", currency="USD", output="5", **extra) -> dict:
    return {
        "name": name,
        "currency": currency,
        "effective_from": since,
        "prices": [
            {
                "served_model": "tiny",
                "input_per_mtok": "1",
                "cached_input_per_mtok": "0.25",
                "output_per_mtok": output,
            }
        ],
        **extra,
    }


def test_finance_creates_a_new_version_from_a_future_date(world, finance, fran):
    v1 = world.price().book
    body = _version(
        reservation_per_gpu_hour="1.20",
        prices=[
            {
                "served_model": "tiny",
                "input_per_mtok": "1",
                "cached_input_per_mtok": "0.25",
                "output_per_mtok": "5",
                "per_gpu_second": "0.0002",
                "tiers": [
                    {"kind": "output", "from_tokens": 0, "per_mtok": "5"},
                    {"kind": "output", "from_tokens": 10_000_000, "per_mtok": "4.5"},
                ],
            }
        ],
    )

    created = finance.post(BOOKS, body, format="json")

    assert created.status_code == 201, created.json()
    v2 = created.json()
    assert (v2["name"], v2["version"], v2["status"]) == ("list", 2, "scheduled")
    assert v2["effective_from"] == "2026-12-01T00:00:00Z" and v2["effective_to"] is None
    [price] = v2["prices"]
    assert price["output_per_mtok"] == "5.000000000"
    assert [t["from_tokens"] for t in price["tiers"]] == [0, 10_000_000]
    v1.refresh_from_db()
    assert v1.effective_to == DEC  # the version it supersedes closes where it begins
    listed = {(b["version"], b["status"]) for b in finance.get(BOOKS).json()}
    assert listed == {(1, "in_force"), (2, "scheduled")}

    [insert] = AuditEntry.objects.filter(table="billing_pricebook", row_id=str(v2["id"]))
    assert (insert.action, insert.actor, insert.actor_user_id, insert.via) == (
        "insert",
        "fran",
        fran.pk,
        "session",
    )
    closed = AuditEntry.objects.filter(table="billing_pricebook", row_id=str(v1.pk)).last()
    assert closed.action == "update" and closed.changed == ["effective_to"]
    assert closed.actor == "fran"


def test_a_version_in_force_is_never_edited_nor_withdrawn(world, finance):
    v1 = world.price().book
    path = f"{BOOKS}/{v1.pk}"

    edited = finance.patch(path, {"reservation_per_gpu_hour": "9"}, format="json")
    assert edited.status_code == 409, edited.json()
    error = edited.json()["error"]
    assert error["code"] == "price_version_in_force"
    assert "list v1 is in force since 2026-10-01 00:00 UTC" in error["message"]
    assert "create a new version from a date" in error["message"]
    assert finance.delete(path).status_code == 409

    # And no other path edits it: the model refuses too (the admin's save, a shell).
    v1.reservation_per_gpu_hour = D("9")
    with pytest.raises(PriceVersionInForceError):
        v1.save()
    price = ModelPrice.objects.get(book=v1)
    price.output_per_mtok = D("4.2")
    with pytest.raises(PriceVersionInForceError):
        price.save()
    with pytest.raises(PriceVersionInForceError):
        price.delete()
    v1.refresh_from_db()
    assert v1.reservation_per_gpu_hour == 0
    assert ModelPrice.objects.get(book=v1).output_per_mtok == 4


def test_a_scheduled_version_is_edited_moved_and_withdrawn(world, finance):
    v1 = world.price().book
    v2 = finance.post(BOOKS, _version(), format="json").json()
    path = f"{BOOKS}/{v2['id']}"

    moved = finance.patch(
        path,
        {"effective_from": "2026-12-02T06:00:00Z", "prices": _version(output="6")["prices"]},
        format="json",
    )
    assert moved.status_code == 200, moved.json()
    assert moved.json()["prices"][0]["output_per_mtok"] == "6.000000000"
    v1.refresh_from_db()
    assert v1.effective_to == datetime(2026, 12, 2, 6, tzinfo=UTC)

    assert finance.delete(path).status_code == 204
    v1.refresh_from_db()
    assert v1.effective_to is None  # runs on as before
    assert not PriceBook.objects.filter(pk=v2["id"]).exists()


def test_a_version_dated_into_an_invoiced_period_or_the_past_is_409(issued, finance):
    into_october = finance.post(BOOKS, _version(since="2026-10-15"), format="json")
    assert into_october.status_code == 409, into_october.json()
    error = into_october.json()["error"]
    assert error["code"] == "price_period_closed"
    assert error["message"].startswith("effective_from: 2026-10-15 00:00 UTC is inside the closed")
    assert "invoiced up to 2026-11-01 00:00 UTC" in error["message"]

    yesterday = finance.post(BOOKS, _version(since="2026-11-27"), format="json")
    assert yesterday.status_code == 409
    assert yesterday.json()["error"]["code"] == "terms_backdated"
    assert "before the current hour (2026-11-28 10:00 UTC)" in yesterday.json()["error"]["message"]

    this_hour = finance.post(BOOKS, _version(since="2026-11-28T10:00:00Z"), format="json")
    assert this_hour.status_code == 201, this_hour.json()
    assert this_hour.json()["status"] == "in_force"
    assert PriceBook.objects.filter(name="list").count() == 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"effective_from": "2026-12-01T00:30:00Z"}, "effective_from"),
        ({"effective_from": "0001-01-01"}, "effective_from"),
        ({"currency": "XYZ"}, "currency"),
        ({"tier": "gold"}, "tier"),
        ({"drafts": True}, "drafts"),
        ({"reservation_per_gpu_hour": "1e2"}, "reservation_per_gpu_hour"),
        ({"reservation_per_gpu_hour": "1,50"}, "reservation_per_gpu_hour"),
        ({"reservation_per_gpu_hour": "-1"}, "reservation_per_gpu_hour"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(world, finance, change, field):
    world.price()
    answer = finance.post(BOOKS, _version() | change, format="json")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"]["field"] == field
    assert PriceBook.objects.count() == 1


def test_an_empty_name_filter_is_a_400_naming_it_not_every_book(world, finance):
    world.price()
    answer = finance.get(f"{BOOKS}?name=")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"]["field"] == "name"
    assert len(finance.get(f"{BOOKS}?name=list").json()) >= 1


@pytest.mark.parametrize(
    ("price", "field"),
    [
        ({"output_per_mtok": "1e1"}, "prices.0.output_per_mtok"),
        ({"served_model": "nope"}, "prices.0.served_model"),
        ({"tiers": [{"kind": "output", "from_tokens": 5, "per_mtok": "1"}]}, "prices.0.tiers"),
        (
            {"tiers": [{"kind": "tokens", "from_tokens": 0, "per_mtok": "1"}]},
            "prices.0.tiers.0.kind",
        ),
        ({"colour": "red"}, "prices.0.colour"),
    ],
)
def test_a_bad_model_price_is_a_400_naming_it(world, finance, price, field):
    body = _version()
    body["prices"][0] |= price
    answer = finance.post(BOOKS, body, format="json")
    assert answer.status_code == 400, answer.json()
    assert answer.json()["error"]["field"] == field


def test_versions_of_a_name_keep_its_currency_and_a_yen_book_prices_fractions_of_a_yen(
    world, finance
):
    world.price()  # "list", USD
    other = finance.post(BOOKS, _version(currency="JPY"), format="json")
    assert other.status_code == 400 and other.json()["error"]["field"] == "currency"

    # Unit prices keep 9 places in any currency: 0.03 JPY a GPU-second is real.
    body = _version(name="list-jpy", currency="JPY", output="600")
    body["prices"][0]["per_gpu_second"] = "0.03"
    yen = finance.post(BOOKS, body, format="json")
    assert yen.status_code == 201, yen.json()
    assert (yen.json()["currency"], yen.json()["version"]) == ("JPY", 1)


@pytest.mark.parametrize("currency", ["USD", "JPY"])
def test_a_new_price_from_a_date_prices_only_usage_from_then_on(world, finance, currency):
    """1M output tokens before the change at 4 (USD/M, or 600 JPY/M), 1M
    after at 8 (1,200 JPY): the draft has a line at each price."""
    scale = D(150) if currency == "JPY" else D(1)
    tenant = world.a if currency == "USD" else make_tenant(name="Nippon", billing_currency="JPY")
    world.price(currency=currency, output_per_mtok=4 * scale)
    name = "list" if currency == "USD" else "list-jpy"
    since = datetime(2026, 11, 28, 12, tzinfo=UTC)
    body = _version(name=name, currency=currency, since=since.isoformat(), output=str(8 * scale))
    assert finance.post(BOOKS, body, format="json").status_code == 201
    world.tokens(tenant, hour=datetime(2026, 11, 20, 9, tzinfo=UTC), completion=1_000_000)
    world.tokens(tenant, hour=since - timedelta(hours=1), completion=1_000_000)
    world.tokens(tenant, hour=since, completion=1_000_000)

    draft, _ = invoice_draft_build(tenant=tenant, period_start=NOV, period_end=DEC)

    lines = sorted((line.unit_price, line.quantity, line.book) for line in draft.lines.all())
    assert lines == [
        (4 * scale, 2_000_000, f"{name} v1"),
        (8 * scale, 1_000_000, f"{name} v2"),
    ]
    assert draft.currency == currency
    assert draft.subtotal_minor == {"USD": 1600, "JPY": 2400}[currency]


def test_tenant_members_and_keys_cannot_reach_the_prices_api(world, finance):
    book = world.price().book
    tenant = world.a
    owner = client_for_user(make_member(tenant, Role.OWNER).user)
    viewer = client_for_user(make_member(tenant, Role.VIEWER).user)
    _, secret = make_key(tenant)
    key = client_for_key(secret)
    calls = [
        ("get", BOOKS, None),
        ("post", BOOKS, _version()),
        ("get", f"{BOOKS}/{book.pk}", None),
        ("patch", f"{BOOKS}/{book.pk}", {"reservation_per_gpu_hour": "1"}),
        ("delete", f"{BOOKS}/{book.pk}", None),
        ("get", "/api/v1/plans", None),
        ("post", "/api/v1/plans", {"name": "Gold"}),
        ("get", f"/api/v1/tenants/{tenant.slug}/subscriptions", None),
        ("post", f"/api/v1/tenants/{tenant.slug}/subscriptions", {"plan": 1}),
        ("get", f"/api/v1/tenants/{tenant.slug}/policy", None),
        ("patch", f"/api/v1/tenants/{tenant.slug}/policy", {"requests_per_minute": 1}),
    ]
    for client in (owner, viewer, key):
        for method, path, body in calls:
            answer = getattr(client, method)(path, body, format="json")
            assert answer.status_code == 403, (method, path, answer.status_code)
    assert PriceBook.objects.count() == 1
    assert finance.get(BOOKS).status_code == 200


def test_a_version_copies_tiers_and_keeps_them_apart_from_the_one_before(world, finance):
    v1 = world.price()
    VolumeTier.objects.create(model_price=v1, kind="output", from_tokens=0, per_mtok=4)
    body = _version()
    body["prices"][0]["tiers"] = [{"kind": "output", "from_tokens": 0, "per_mtok": "5"}]
    v2 = finance.post(BOOKS, body, format="json").json()
    assert VolumeTier.objects.get(model_price=v1).per_mtok == 4
    assert VolumeTier.objects.get(model_price__book_id=v2["id"]).per_mtok == 5
