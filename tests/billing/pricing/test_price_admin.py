"""The admin stays for operators, held to the same rules as finance's pages
and API (issue 59, item 3): a price book version in force and its prices
are read-only, a POST changing one is refused with the message and
nothing changes, "New version from a date" copies it; a version added
there goes through the service (dated into an invoiced period: an error
on effective_from); a plan in use is read-only."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.contrib.messages import get_messages

from audit.models import AuditEntry
from billing.models import ModelPrice, Plan, PriceBook, Subscription, VolumeTier
from tests.factories import make_finance_user

REFUSED = "is in force since 2026-10-01 00:00 UTC and is never edited"


@pytest.fixture
def operator(client, db):
    client.force_login(make_finance_user(username="root", is_staff=True, is_superuser=True))
    return client


def _book_form(**fields) -> dict:
    return {
        "name": "list",
        "version": "2",
        "tier": "",
        "currency": "USD",
        "effective_from_0": "2026-12-01",
        "effective_from_1": "00:00:00",
        "reservation_per_gpu_hour": "0",
        "dedicated_per_gpu_month": "0",
        "prices-TOTAL_FORMS": "0",
        "prices-INITIAL_FORMS": "0",
        "prices-MIN_NUM_FORMS": "0",
        "prices-MAX_NUM_FORMS": "1000",
    } | fields


def _messages(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_a_version_in_force_is_read_only_and_a_change_is_refused(world, operator):
    price = world.price()
    VolumeTier.objects.create(model_price=price, kind="output", from_tokens=0, per_mtok=4)
    book = price.book
    change = f"/admin/billing/pricebook/{book.pk}/change/"

    page = operator.get(change)
    assert page.status_code == 200
    text = page.content.decode()
    assert REFUSED in text and f"/admin/billing/pricebook/{book.pk}/new-version/" in text
    assert 'name="reservation_per_gpu_hour"' not in text  # read-only

    refused = operator.post(change, _book_form(version="1", reservation_per_gpu_hour="9"))
    assert refused.status_code == 302
    assert any(REFUSED in m for m in _messages(refused))
    price_change = f"/admin/billing/modelprice/{price.pk}/change/"
    refused = operator.post(price_change, {"book": book.pk, "output_per_mtok": "4.2"})
    assert refused.status_code == 302
    assert any(REFUSED in m for m in _messages(refused))
    book.refresh_from_db()
    price.refresh_from_db()
    assert (book.reservation_per_gpu_hour, price.output_per_mtok) == (0, 4)
    assert (
        operator.post(f"/admin/billing/pricebook/{book.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    assert PriceBook.objects.filter(pk=book.pk).exists()


def test_new_version_from_a_date_copies_the_prices_and_closes_the_one_before(world, operator):
    price = world.price()
    VolumeTier.objects.create(model_price=price, kind="output", from_tokens=0, per_mtok=4)
    url = f"/admin/billing/pricebook/{price.book.pk}/new-version/"
    assert operator.get(url).status_code == 200

    backdated = operator.post(url, {"effective_from_0": "2026-11-01", "effective_from_1": "00:00"})
    assert backdated.status_code == 200
    assert "before the current hour" in backdated.content.decode()

    made = operator.post(url, {"effective_from_0": "2026-12-01", "effective_from_1": "00:00"})
    assert made.status_code == 302, made.content.decode()[:3000]
    v2 = PriceBook.objects.get(name="list", version=2)
    [insert] = AuditEntry.objects.filter(table="billing_pricebook", row_id=str(v2.pk))
    assert (insert.actor, insert.via) == ("root", "admin")  # the dry run kept who
    copy = ModelPrice.objects.get(book=v2)
    assert (copy.output_per_mtok, copy.tiers.get().per_mtok) == (4, 4)
    price.book.refresh_from_db()
    assert price.book.effective_to == datetime(2026, 12, 1, tzinfo=UTC)

    # Scheduled: editable in the admin, through the service.
    change = f"/admin/billing/pricebook/{v2.pk}/change/"
    form = _book_form(reservation_per_gpu_hour="1.5", effective_from_0="2026-12-02")
    edited = operator.post(change, form)
    assert edited.status_code == 302, edited.content.decode()[:3000]
    price.book.refresh_from_db()
    assert price.book.effective_to == datetime(2026, 12, 2, tzinfo=UTC)


def test_a_version_added_into_an_invoiced_period_is_an_error_on_effective_from(issued, operator):
    answer = operator.post(
        "/admin/billing/pricebook/add/", _book_form(effective_from_0="2026-10-15")
    )
    assert answer.status_code == 200
    assert "inside the closed period (invoiced up to 2026-11-01 00:00 UTC)" in (
        answer.content.decode()
    )
    assert PriceBook.objects.filter(name="list").count() == 1

    added = operator.post("/admin/billing/pricebook/add/", _book_form())
    assert added.status_code == 302, added.content.decode()[:3000]
    assert PriceBook.objects.get(name="list", version=1).effective_to == datetime(
        2026, 12, 1, tzinfo=UTC
    )


def test_a_plan_in_use_is_read_only_in_the_admin(world, operator):
    plan = Plan.objects.create(name="Committed", minimum_commit=500)
    Subscription.objects.create(tenant=world.a, plan=plan, start=datetime(2026, 9, 1, tzinfo=UTC))
    form = {
        "name": "Committed",
        "currency": "USD",
        "minimum_commit": "600",
        "discount_percent": "0",
    }
    refused = operator.post(f"/admin/billing/plan/{plan.pk}/change/", form)
    assert refused.status_code == 302
    assert any("never edited" in m for m in _messages(refused))
    plan.refresh_from_db()
    assert plan.minimum_commit == 500

    yen = operator.post(
        "/admin/billing/plan/add/",
        {"name": "Yen", "currency": "JPY", "minimum_commit": "1.5", "discount_percent": "0"},
    )
    assert yen.status_code == 200 and "JPY has 0 decimal places" in yen.content.decode()
