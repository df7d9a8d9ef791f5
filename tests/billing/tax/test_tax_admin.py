"""Tax through the admin goes through the same checks as the API and the
page: a bad country, id, percent or day is an error on its field and
nothing is written; a rate is never edited there."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import TaxProfile, TaxRate


def _admin() -> Client:
    user = get_user_model().objects.create_superuser("root", "root@example.test", "pw")
    client = Client()
    client.force_login(user)
    return client


def test_admin_refuses_bad_rates_and_profiles_on_their_fields(world):
    client = _admin()
    rate = {"country": "FR", "name": "VAT", "percent": "20", "valid_from": "2026-01-01"}

    bad = client.post("/admin/billing/taxrate/add/", {**rate, "country": "QQ"})
    assert bad.status_code == 200 and "is not an ISO 3166-1 alpha-2" in bad.content.decode()
    assert client.post("/admin/billing/taxrate/add/", rate).status_code == 302
    again = client.post("/admin/billing/taxrate/add/", {**rate, "percent": "19"})
    assert (
        again.status_code == 200
        and "FR already has a rate from 2026-01-01" in again.content.decode()
    )
    assert list(TaxRate.objects.values_list("country", "percent")) == [("FR", 20)]
    rate_id = TaxRate.objects.get().pk
    changed = client.post(f"/admin/billing/taxrate/{rate_id}/change/", {**rate, "percent": "5"})
    assert changed.status_code == 403 and TaxRate.objects.get().percent == 20

    profile = {"tenant": world.a.pk, "country": "DE", "tax_id": "FR40303265045"}
    bad = client.post("/admin/billing/taxprofile/add/", profile)
    assert bad.status_code == 200 and "starts with DE" in bad.content.decode()
    assert not TaxProfile.objects.exists()
    done = client.post("/admin/billing/taxprofile/add/", {**profile, "tax_id": "de 123 456 789"})
    assert done.status_code == 302
    assert TaxProfile.objects.get().tax_id == "DE123456789"
