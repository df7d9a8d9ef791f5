"""Stripe through the real SDK against the fake server: one customer and
one Stripe invoice per invoice with the right items, whatever crashes or
faults happen in between; webhooks verified, stored once, handled once,
in any order."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal

import pytest

from billing.choices import InvoiceStatus, StripeSync
from billing.invoicing.credit_notes import credit_note_create
from billing.invoicing.invoices import invoice_draft_build, invoice_finalize, invoice_transition
from billing.models import CreditGrant, Invoice, StripeCustomer, StripeEvent
from billing.payments import stripe_api
from billing.payments.sync import invoice_stripe_sync, invoices_awaiting_sync
from billing.tasks import stripe_sweep_task
from tests.billing.conftest import NOV, OCT
from tests.conftest import client_for_user
from tests.factories import make_finance_user
from tests.stripe_fake import sign

WEBHOOK = "/stripe/webhook"


@pytest.fixture
def invoice(world, stripe_fake) -> Invoice:
    """Alpha's October: $1.00 input, $4.00 output, $1.50 prepaid credit."""
    world.price()
    world.tokens(world.a, hour=OCT + timedelta(hours=3), prompt=1_000_000, completion=1_000_000)
    CreditGrant.objects.create(tenant=world.a, amount=Decimal("1.5"), granted_at=OCT)
    draft, _ = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)
    return invoice_finalize(invoice_id=draft.pk)


def _assert_one_stripe_invoice(fake, invoice: Invoice) -> dict:
    invoice.refresh_from_db()
    assert len(fake.customers) == 1 and len(fake.invoices) == 1
    stripe_invoice = fake.invoices[invoice.stripe_invoice_id]
    ours = sorted(line.amount_minor for line in invoice.lines.all())
    assert sorted(i["amount"] for i in fake.items.values()) == ours == [-150, 100, 400]
    assert stripe_invoice["status"] == "open" and stripe_invoice["total"] == 350
    assert stripe_invoice["metadata"]["ledger_invoice_id"] == str(invoice.pk)
    assert invoice.stripe_sync == StripeSync.SYNCED and invoice.stripe_status == "open"
    assert invoice.hosted_invoice_url.endswith(invoice.stripe_invoice_id)
    return stripe_invoice


def test_finalizing_creates_the_customer_items_and_invoice_once(world, invoice, stripe_fake):
    assert invoice.stripe_sync == StripeSync.PENDING

    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.SYNCED

    _assert_one_stripe_invoice(stripe_fake, invoice)
    customer = StripeCustomer.objects.get(tenant=world.a)
    assert customer.stripe_customer_id in stripe_fake.customers
    assert not StripeCustomer.objects.filter(tenant=world.b).exists()
    tenants = client_for_user(make_finance_user()).get("/api/v1/tenants").json()
    linked = {t["slug"]: t["stripe_linked"] for t in tenants}
    assert linked[world.a.slug] is True and linked[world.b.slug] is False
    writes = len(stripe_fake.writes)
    invoice_stripe_sync(invoice_id=invoice.pk)  # again: nothing new
    assert len(stripe_fake.writes) == writes


class Crash(Exception):
    """The worker dies right after Stripe did the work."""


STRIPE_WRITES = ["customer_create", "invoice_create", "invoice_item_create", "invoice_finalize"]


@pytest.mark.parametrize("crash_at", range(6))  # customer, invoice, 3 items, finalize
def test_a_crash_between_any_two_calls_then_a_rerun_leaves_exactly_one_invoice(
    invoice, stripe_fake, monkeypatch, crash_at
):
    calls = []
    for name in STRIPE_WRITES:
        real = getattr(stripe_api, name)

        def wrapped(*args, _real=real, **kwargs):
            result = _real(*args, **kwargs)
            calls.append(1)
            if len(calls) - 1 == crash_at:
                raise Crash
            return result

        monkeypatch.setattr(stripe_api, name, wrapped)

    with pytest.raises(Crash):
        invoice_stripe_sync(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_sync == StripeSync.FAILED

    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.SYNCED

    _assert_one_stripe_invoice(stripe_fake, invoice)


def test_stripe_errors_and_timeouts_are_retried_without_duplicates(invoice, stripe_fake):
    stripe_fake.fail("/v1/customers", "timeout")  # done at Stripe, answer lost
    stripe_fake.fail("/v1/invoiceitems", "500", times=2)
    stripe_fake.fail("/v1/invoices/", "timeout")  # the finalize

    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.SYNCED

    _assert_one_stripe_invoice(stripe_fake, invoice)


def test_while_stripe_is_down_nothing_is_lost_and_the_sweep_finishes_the_job(
    invoice, stripe_fake, monkeypatch
):
    stripe_fake.down = True
    with pytest.raises(stripe_api.TRANSIENT_ERRORS):
        invoice_stripe_sync(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    assert invoice.stripe_sync == StripeSync.FAILED and "down" in invoice.stripe_error
    assert invoices_awaiting_sync() == [invoice.pk]

    stripe_fake.down = False
    from billing import tasks

    monkeypatch.setattr(
        tasks.invoice_stripe_sync_task, "delay", lambda pk: invoice_stripe_sync(invoice_id=pk)
    )
    assert stripe_sweep_task() == 1

    _assert_one_stripe_invoice(stripe_fake, invoice)
    assert invoices_awaiting_sync() == []


def test_our_void_and_credit_notes_follow_to_stripe(invoice, stripe_fake):
    invoice_stripe_sync(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    credit_note_create(invoice_id=invoice.pk, amount_minor=50, reason="goodwill")
    invoice_stripe_sync(invoice_id=invoice.pk)
    (note,) = stripe_fake.credit_notes.values()
    assert note["amount"] == 50 and note["invoice"] == invoice.stripe_invoice_id

    invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.VOID)
    invoice.refresh_from_db()
    assert invoice.stripe_sync == StripeSync.PENDING
    invoice_stripe_sync(invoice_id=invoice.pk)

    assert stripe_fake.invoices[invoice.stripe_invoice_id]["status"] == "void"
    invoice.refresh_from_db()
    assert invoice.stripe_status == "void" and invoice.stripe_sync == StripeSync.SYNCED


def test_a_credit_note_on_a_paid_invoice_is_settled_out_of_band_after_the_payment(
    invoice, stripe_fake
):
    """Marked paid here (a bank transfer), then credited (the amount back
    in the wallet), both before the sync runs: Stripe hears of the payment
    first, then takes the note as settled out of band (it refuses a note on
    a paid invoice that says nowhere where the money went)."""
    invoice_stripe_sync(invoice_id=invoice.pk)
    invoice_transition(invoice_id=invoice.pk, to=InvoiceStatus.PAID)
    credit_note_create(invoice_id=invoice.pk, amount_minor=50, reason="goodwill")
    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.SYNCED

    (note,) = stripe_fake.credit_notes.values()
    assert (note["amount"], note["out_of_band_amount"]) == (50, 50)
    invoice.refresh_from_db()
    assert stripe_fake.invoices[invoice.stripe_invoice_id]["status"] == "paid"


def _deliver(client, body: bytes, signature: str | None = None):
    return client.post(
        WEBHOOK,
        data=body,
        content_type="application/json",
        HTTP_STRIPE_SIGNATURE=signature if signature is not None else sign(body),
    )


def test_webhooks_are_verified_stored_once_and_handled_in_any_order(
    client, world, invoice, stripe_fake
):
    invoice_stripe_sync(invoice_id=invoice.pk)
    invoice.refresh_from_db()
    stripe_invoice = dict(stripe_fake.invoices[invoice.stripe_invoice_id], status="paid")
    paid = stripe_fake.event("invoice.paid", stripe_invoice, event_id="evt_paid")

    forged = _deliver(client, paid, signature=sign(paid, secret="whsec_wrong"))
    stale = _deliver(client, paid, signature=sign(paid, timestamp=int(time.time()) - 600))
    unsigned = _deliver(client, paid, signature="")
    assert [r.status_code for r in (forged, stale, unsigned)] == [400, 400, 400]
    assert not StripeEvent.objects.exists()
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.FINALIZED

    first = _deliver(client, paid)
    again = _deliver(client, paid)
    assert first.status_code == again.status_code == 200
    assert StripeEvent.objects.filter(event_id="evt_paid").count() == 1
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID and invoice.stripe_status == "paid"
    # The tenant's webhooks and owners hear of it once (webhooks' invoice.paid).
    from webhooks.models import Event

    [told] = Event.objects.filter(type="invoice.paid", tenant=invoice.tenant)
    assert told.data["number"] == invoice.number and told.data["status"] == "paid"
    assert told.data["total_minor"] == invoice.total_minor and "paid" in told.summary

    # An older event delivered late does not move a paid invoice back.
    voided = stripe_fake.event(
        "invoice.voided", dict(stripe_invoice, status="void"), created=time.time() - 60
    )
    late = _deliver(client, voided)
    assert late.status_code == 200 and late.json()["outcome"].startswith("stale")
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.PAID

    unknown = _deliver(client, stripe_fake.event("price.created", {"id": "price_1"}))
    assert unknown.status_code == 200 and unknown.json()["outcome"].startswith("ignored")


def test_events_about_failed_payments_unknown_ids_and_deleted_customers(
    client, world, invoice, stripe_fake
):
    # Before we saved the Stripe id: found by our id in the metadata.
    early = {"id": "in_not_saved_yet", "metadata": {"ledger_invoice_id": str(invoice.pk)}}
    failed = _deliver(client, stripe_fake.event("invoice.payment_failed", early))
    assert failed.status_code == 200
    invoice.refresh_from_db()
    assert invoice.payment_failed_at is not None and invoice.status == InvoiceStatus.FINALIZED
    # The tenant's webhooks and owners hear of it (webhooks' invoice.payment_failed).
    from webhooks.models import Event

    [told] = Event.objects.filter(type="invoice.payment_failed", tenant=invoice.tenant)
    assert told.data["number"] == invoice.number and "failed" in told.summary

    uncollectible = _deliver(client, stripe_fake.event("invoice.marked_uncollectible", early))
    assert uncollectible.status_code == 200
    invoice.refresh_from_db()
    assert invoice.status == InvoiceStatus.UNCOLLECTIBLE

    stranger = _deliver(client, stripe_fake.event("invoice.paid", {"id": "in_someone_else"}))
    assert stranger.status_code == 200 and "no invoice" in stranger.json()["outcome"]

    StripeCustomer.objects.update_or_create(
        tenant=world.a, defaults={"stripe_customer_id": "cus_gone"}
    )
    StripeCustomer.objects.create(tenant=world.b, stripe_customer_id="cus_kept")
    deleted = stripe_fake.event("customer.deleted", {"id": "cus_gone", "object": "customer"})
    response = _deliver(client, deleted)
    assert response.status_code == 200
    assert response.json()["outcome"] == "customer unlinked from 1 tenant(s)"
    assert not StripeCustomer.objects.filter(tenant=world.a).exists()
    assert StripeCustomer.objects.get(tenant=world.b).stripe_customer_id == "cus_kept"
    assert (
        StripeEvent.objects.get(type="customer.deleted").payload["data"]["object"]["id"]
        == "cus_gone"
    )


def test_without_a_stripe_key_invoices_stay_local(world, settings):
    settings.STRIPE_API_KEY = ""
    world.price()
    world.tokens(world.a, hour=OCT + timedelta(hours=3), completion=1_000_000)
    draft, _ = invoice_draft_build(tenant=world.a, period_start=OCT, period_end=NOV)

    invoice = invoice_finalize(invoice_id=draft.pk)

    assert invoice.stripe_sync == StripeSync.NOT_SYNCED
    assert invoice_stripe_sync(invoice_id=invoice.pk) == StripeSync.NOT_SYNCED
    assert invoices_awaiting_sync() == []
