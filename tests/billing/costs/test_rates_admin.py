"""Rates through the admin go through the rate service: an overlap is an
error on its field and nothing is written; a change closes the open rate."""

from __future__ import annotations

from datetime import UTC, datetime

from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import CostRate


def _admin() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.test", "pw")
    client = Client()
    client.force_login(user)
    return client


def _form(**fields) -> dict:
    base = {
        "component": "energy",
        "basis": "per_kwh",
        "amount": "0.12",
        "currency": "USD",
        "hour_from": 0,
        "hour_to": 24,
        "effective_from_0": "2026-03-01",
        "effective_from_1": "00:00:00",
        "note": "",
    }
    return base | fields


def test_admin_refuses_an_overlap_on_its_field_and_books_a_change(world):
    world.rate("energy", "0.10", "per_kwh", effective_to=datetime(2026, 2, 1, tzinfo=UTC))
    client = _admin()

    clash = client.post("/admin/billing/costrate/add/", _form(**{"effective_from_0": "2026-01-15"}))
    assert clash.status_code == 200  # the form again, with the error
    assert "overlaps rate" in clash.content.decode()
    assert CostRate.objects.count() == 1

    booked = client.post("/admin/billing/costrate/add/", _form())
    assert booked.status_code == 302, booked.content.decode()[:2000]
    assert CostRate.objects.count() == 2
    assert CostRate.objects.get(amount="0.12").created_by.username == "root"
