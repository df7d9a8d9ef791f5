"""Finance staff act on an invoice from its page: finalize a draft, void,
mark paid, issue a credit note; a bad amount is a 400 naming the field, a
forbidden move a 409, and neither writes anything; tenants cannot act."""

from __future__ import annotations

from billing.models import CreditNote, Invoice
from tests.factories import make_finance_user, make_member


def _act(client, invoice, **data):
    return client.post(f"/invoices/{invoice.pk}/action", data)


def test_finance_finalizes_a_draft_and_credits_an_invoice_from_its_page(client, world, issued):
    client.force_login(make_finance_user())
    draft = issued["draft"]

    page = client.get(f"/invoices/{draft.pk}/").content.decode()
    # November has not ended: the page offers to finalize early, with a reason.
    assert 'data-testid="action-finalize-early"' in page and "credit-note-form" not in page

    response = _act(client, draft, action="finalized", finalize_early="1", reason="moving on")
    assert response.status_code == 302 and response.url == f"/invoices/{draft.pk}/"
    draft.refresh_from_db()
    assert draft.status == "finalized" and draft.number
    page = client.get(response.url).content.decode()
    assert (
        f"Invoice {draft.number} is now finalized." in page
        and 'data-testid="credit-note-form"' in page
    )

    alpha = issued[world.a.slug]  # 4.00 USD
    response = _act(client, alpha, action="credit_note", amount="1.50", reason="outage on 3 Oct")
    assert response.status_code == 302
    note = CreditNote.objects.get(invoice=alpha)
    assert (note.amount_minor, note.reason) == (150, "outage on 3 Oct")
    assert f"Credit note {note.number} issued." in client.get(response.url).content.decode()


def test_bad_amounts_name_the_field_and_write_nothing(client, world, issued):
    client.force_login(make_finance_user())
    alpha = issued[world.a.slug]
    for amount, message in (
        ("abc", "amount: &#x27;abc&#x27; is not a number"),
        ("-1", "amount: must not be negative"),
        ("0", "amount: must be a positive amount"),
        ("1.005", "amount: USD has 2 decimal places"),
        ("4.01", "amount_minor: at most 400 minor units are left to credit"),
    ):
        response = _act(client, alpha, action="credit_note", amount=amount, reason="x")
        assert response.status_code == 400, amount
        assert message in response.content.decode(), amount
    response = _act(client, alpha, action="credit_note", amount="1", reason="  ")
    assert response.status_code == 400 and "reason: a credit note needs a reason" in (
        response.content.decode()
    )
    assert _act(client, alpha, action="refund").status_code == 400
    assert not CreditNote.objects.exists()


def test_a_move_the_state_machine_forbids_is_a_409_and_changes_nothing(client, world, issued):
    client.force_login(make_finance_user())
    alpha = issued[world.a.slug]
    assert _act(client, alpha, action="void").status_code == 302
    response = _act(client, alpha, action="paid")
    assert response.status_code == 409
    assert "cannot become paid" in response.content.decode()
    assert Invoice.objects.get(pk=alpha.pk).status == "void"


def test_tenant_members_see_no_actions_and_cannot_act(client, world, issued):
    owner = make_member(world.a)
    client.force_login(owner.user)
    alpha = issued[world.a.slug]
    page = client.get(f"/invoices/{alpha.pk}/").content.decode()
    assert "invoice-actions" not in page
    assert _act(client, alpha, action="void").status_code == 403
    assert _act(client, alpha, action="credit_note", amount="1", reason="x").status_code == 403
    assert Invoice.objects.get(pk=alpha.pk).status == "finalized"
    assert not CreditNote.objects.exists()
