"""A tenant's own tax details: its owners and admins send its country and
VAT/GST id on the invoices page or through the API, checked as finance's
are (a 400 naming the field, nothing written), and they apply only once
finance confirms them (issue 60, finding 5: a tenant typing another EU
country's VAT id was reverse-charged at once); viewers and keys only read
them; an exemption is finance's to set and survives the tenant's edits;
each change is in the audit trail as the person's."""

from __future__ import annotations

import pytest

from audit.models import AuditEntry
from billing.models import TaxProfile
from tenants.choices import Role
from tenants.services import membership_set
from tests.conftest import client_for_key, client_for_user
from tests.factories import make_finance_user, make_key, make_member

pytestmark = pytest.mark.django_db


def profile_url(tenant) -> str:
    return f"/api/v1/tenants/{tenant.slug}/tax-profile"


def test_an_owner_sets_the_tax_details_on_the_invoices_page(world):
    owner = make_member(world.a, Role.OWNER).user
    page = client_for_user(owner)
    shown = page.get("/invoices/").content.decode()
    assert "No tax details yet" in shown and 'data-testid="tax-details-form"' in shown

    answer = page.post("/invoices/tax-details", {"country": "de", "tax_id": "DE 123 456 789"})
    assert answer.status_code == 302 and answer["Location"] == "/invoices/"
    assert not TaxProfile.objects.filter(tenant=world.a).exists()  # sent, not applied
    shown = page.get("/invoices/").content.decode()
    assert 'data-testid="tax-request"' in shown and "<strong>DE123456789</strong>" in shown
    [entry] = AuditEntry.objects.filter(table="billing_taxdetailsrequest")
    assert (entry.action, entry.actor, entry.via, entry.tenant_id) == (
        "insert",
        owner.username,
        "session",
        world.a.pk,
    )
    assert entry.request == "POST /invoices/tax-details"

    # Finance confirms it on the tax page: now it applies.
    fran = make_finance_user(username="fran")
    finance = client_for_user(fran)
    listed = finance.get("/finance/tax/").content.decode()
    assert f'data-testid="tax-confirm-{world.a.slug}"' in listed
    confirmed = finance.post("/finance/tax/", {"action": "confirm", "tenant": world.a.slug})
    assert confirmed.status_code == 302
    profile = TaxProfile.objects.get(tenant=world.a)
    assert (profile.country, profile.tax_id, profile.exempt) == ("DE", "DE123456789", False)
    shown = page.get("/invoices/").content.decode()
    assert "<strong>DE</strong>" in shown and 'data-testid="tax-request"' not in shown
    [entry] = AuditEntry.objects.filter(table="billing_taxprofile")
    assert (entry.action, entry.actor) == ("insert", "fran")


@pytest.mark.parametrize(
    ("form", "field"),
    [
        ({"country": "XX"}, "country"),
        ({"country": "FR", "tax_id": "DE123456789"}, "tax_id"),
        ({"country": ""}, "country"),
    ],
)
def test_a_bad_tax_detail_on_the_page_is_a_400_naming_the_field(world, form, field):
    page = client_for_user(make_member(world.a, Role.ADMIN).user)
    answer = page.post("/invoices/tax-details", form)
    assert answer.status_code == 400
    assert f'data-testid="tax-error">{field}:' in answer.content.decode()
    assert not TaxProfile.objects.exists()


def test_viewers_and_keys_read_the_tax_details_and_never_set_them(world):
    viewer = client_for_user(make_member(world.a, Role.VIEWER).user)
    assert 'data-testid="tax-details-form"' not in viewer.get("/invoices/").content.decode()
    assert viewer.post("/invoices/tax-details", {"country": "DE"}).status_code == 403
    assert viewer.put(profile_url(world.a), {"country": "DE"}, format="json").status_code == 403
    _, secret = make_key(world.a)
    key = client_for_key(secret)
    assert key.put(profile_url(world.a), {"country": "DE"}, format="json").status_code == 403
    assert not TaxProfile.objects.exists()
    finance = client_for_user(make_finance_user())
    assert (
        finance.post("/invoices/tax-details", {"country": "DE"}).status_code == 403
    )  # /finance/tax/


def test_an_owner_sets_their_own_through_the_api_and_never_an_exemption(world):
    finance = client_for_user(make_finance_user())
    granted = {"country": "FR", "exempt": True, "exempt_reason": "Charity, art. 261-7"}
    assert finance.put(profile_url(world.a), granted, format="json").status_code == 200
    owner = client_for_user(make_member(world.a, Role.OWNER).user)

    answer = owner.put(
        profile_url(world.a), {"country": "FR", "tax_id": "FR40303265045"}, format="json"
    )
    assert answer.status_code == 202, answer.content  # sent: finance confirms it
    assert answer.json()["status"] == "awaiting_confirmation"
    assert TaxProfile.objects.get(tenant=world.a).tax_id == ""  # not yet
    confirmed = finance.post(f"{profile_url(world.a)}/confirm")
    assert confirmed.status_code == 200, confirmed.content
    body = confirmed.json()
    assert (body["country"], body["tax_id"], body["exempt"]) == ("FR", "FR40303265045", True)
    assert body["exempt_reason"] == "Charity, art. 261-7"  # finance's, kept
    assert owner.post(f"{profile_url(world.a)}/confirm").status_code == 403  # finance's alone

    for field, value in (("exempt", False), ("exempt_reason", "")):
        refused = owner.put(profile_url(world.a), {"country": "FR", field: value}, format="json")
        assert refused.status_code == 400 and refused.json()["error"]["field"] == field
    # The profile as read, sent back unchanged: its exemption is no change.
    read_back = owner.get(profile_url(world.a)).json()
    again = owner.put(profile_url(world.a), read_back, format="json")
    assert again.status_code == 200 and again.json()["exempt"] is True
    bad = owner.put(profile_url(world.a), {"country": "Germany"}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["field"] == "country"
    other = owner.put(profile_url(world.b), {"country": "FR"}, format="json")
    assert other.status_code == 404  # another tenant's: not found
    assert not TaxProfile.objects.filter(tenant=world.b).exists()
    profile = TaxProfile.objects.get(tenant=world.a)
    assert (profile.country, profile.tax_id, profile.exempt) == ("FR", "FR40303265045", True)


def test_moving_to_another_country_ends_an_exemption_that_rests_on_the_first(world):
    finance = client_for_user(make_finance_user())
    granted = {"country": "FR", "exempt": True, "exempt_reason": "Charity, art. 261-7"}
    assert finance.put(profile_url(world.a), granted, format="json").status_code == 200
    owner = client_for_user(make_member(world.a, Role.ADMIN).user)
    assert owner.post("/invoices/tax-details", {"country": "BE"}).status_code == 302
    assert TaxProfile.objects.get(tenant=world.a).exempt  # until finance confirms the move
    assert finance.post(f"{profile_url(world.a)}/confirm").status_code == 200
    profile = TaxProfile.objects.get(tenant=world.a)
    assert (profile.country, profile.exempt, profile.exempt_reason) == ("BE", False, "")


def test_finance_staff_who_are_also_members_keep_finance_powers(world):
    """Finance staff acting for a tenant they belong to still set any
    tenant's profile, exemption included."""
    staff = make_finance_user()
    membership_set(tenant=world.a, user=staff, role=Role.VIEWER)
    client = client_for_user(staff)
    granted = {"country": "FR", "exempt": True, "exempt_reason": "Charity, art. 261-7"}
    answer = client.put(profile_url(world.b), granted, format="json")
    assert answer.status_code == 200, answer.content
    assert TaxProfile.objects.get(tenant=world.b).exempt


def test_a_vat_id_sent_by_a_tenant_is_not_reverse_charged_until_finance_confirms_it(world):
    """The attack: a French tenant of an Irish issuer types a well-formed
    German VAT id. Its next invoice is still taxed at France's 20 %."""
    from datetime import UTC, date, datetime

    from billing.invoicing.invoices import invoice_draft_build
    from billing.models import Issuer, TaxRate

    Issuer.objects.update(country="IE", tax_id="IE6388047V")
    TaxRate.objects.create(country="FR", name="TVA", percent=20, valid_from=date(2026, 1, 1))
    finance = client_for_user(make_finance_user())
    assert finance.put(profile_url(world.a), {"country": "FR"}, format="json").status_code == 200
    owner = client_for_user(make_member(world.a, Role.OWNER).user)
    sent = owner.put(
        profile_url(world.a), {"country": "DE", "tax_id": "DE123456789"}, format="json"
    )
    assert sent.status_code == 202

    world.price()
    world.tokens(world.a, hour=datetime(2026, 10, 5, 12, tzinfo=UTC), completion=1_000_000)
    draft, _ = invoice_draft_build(
        tenant=world.a,
        period_start=datetime(2026, 10, 1, tzinfo=UTC),
        period_end=datetime(2026, 11, 1, tzinfo=UTC),
    )
    assert (draft.tax_treatment, draft.buyer_country, draft.tax_minor) == ("standard", "FR", 80)


def test_a_buyer_in_a_country_with_no_tax_rate_is_never_finalized(world):
    """It was finalized with no tax and a warning; now the invoice run
    refuses it naming the country, and finalizes the rest. (A buyer outside
    the issuer's tax, a US one of an Irish issuer, still owes none.)"""
    from datetime import UTC, datetime

    from billing.invoicing.runs import invoice_run_create, invoice_run_execute
    from billing.models import Invoice, Issuer

    Issuer.objects.update(country="IE", tax_id="IE6388047V")
    finance = client_for_user(make_finance_user())
    # A French consumer of an Irish issuer owes French VAT; France has no rate here.
    assert finance.put(profile_url(world.a), {"country": "FR"}, format="json").status_code == 200
    world.price()
    for tenant in (world.a, world.b):
        world.tokens(tenant, hour=datetime(2026, 10, 5, 12, tzinfo=UTC), completion=1_000_000)
    run = invoice_run_execute(
        run_id=invoice_run_create(as_of=datetime(2026, 11, 2, tzinfo=UTC), finalize=True).pk
    )
    assert [f["tenant"] for f in run.failures] == [world.a.slug]
    assert "a buyer in FR, where tax is due and no rate" in run.failures[0]["error"]
    assert Invoice.objects.get(tenant=world.b).status == "finalized"
    assert not Invoice.objects.filter(tenant=world.a, status="finalized").exists()
