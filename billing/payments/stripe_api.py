"""Every call to Stripe, and the only module that imports `stripe`.

The API version is pinned here. Amounts cross this boundary as integer
minor units (Stripe's own unit). Every write carries an Idempotency-Key
derived from our ids, so a retry, or a re-run after a crash between any
two calls, replays Stripe's first answer instead of writing twice; the
Stripe ids we learn are saved as soon as we learn them, so a re-run also
skips what is already done (Stripe forgets keys after 24 hours, we don't).

Configured by STRIPE_API_KEY (and STRIPE_API_BASE for a fake server in
tests). Without a key nothing here is called and invoices stay local."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import stripe
from django.conf import settings

API_VERSION = "2026-10-28.endive"
NETWORK_RETRIES = 3  # the SDK's own retries on timeouts, 409 and 5xx, same key

# Errors worth trying again later (Stripe down, slow, or asking us to back off).
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    stripe.APIConnectionError,
    stripe.RateLimitError,
    stripe.APIError,
)
SignatureError = stripe.SignatureVerificationError


def configured() -> bool:
    return bool(settings.STRIPE_API_KEY)


def _client() -> stripe.StripeClient:
    base = {"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else None
    return stripe.StripeClient(
        settings.STRIPE_API_KEY,
        stripe_version=API_VERSION,
        base_addresses=base,
        max_network_retries=NETWORK_RETRIES,
        http_client=stripe.RequestsClient(timeout=settings.STRIPE_TIMEOUT_SECONDS),
    )


def _key(*parts: object) -> dict[str, str]:
    return {"idempotency_key": "gpu-ledger-" + "-".join(str(p) for p in parts)}


@dataclass(frozen=True)
class ItemSpec:
    """One invoice line as a Stripe invoice item."""

    line_id: int
    amount_minor: int
    description: str
    period_start: int  # unix seconds
    period_end: int
    tax_rates: tuple[str, ...] = ()  # Stripe tax rate ids: Stripe computes the line's tax


def customer_create(*, tenant_id: int, name: str, email: str | None) -> str:
    params: dict[str, Any] = {"name": name, "metadata": {"ledger_tenant_id": str(tenant_id)}}
    if email:
        params["email"] = email
    customer = _client().v1.customers.create(params=params, options=_key("customer", tenant_id))
    return customer.id


def tax_rate_create(*, rate_id: int, display_name: str, percentage, country: str) -> str:
    """Our dated rate as a Stripe tax rate (exclusive: added to the line).
    Stripe's tax rates cannot change their percentage: one per ours."""
    created = _client().v1.tax_rates.create(
        params={
            "display_name": display_name,
            "percentage": float(percentage),  # ok-float: Stripe's API takes a float percentage
            "inclusive": False,
            "country": country,
            "metadata": {"ledger_tax_rate_id": str(rate_id)},
        },
        options=_key("tax-rate", rate_id),
    )
    return created.id


def invoice_create(
    *,
    invoice_id: int,
    number: str,
    customer: str,
    currency: str,
    days_until_due: int,
    footer: str = "",
) -> str:
    params: dict[str, Any] = {
        "customer": customer,
        "currency": currency.lower(),
        "collection_method": "send_invoice",
        "days_until_due": days_until_due,
        "auto_advance": False,
        "pending_invoice_items_behavior": "exclude",
        "description": f"Invoice {number}",
        "metadata": {"ledger_invoice_id": str(invoice_id), "ledger_number": number},
    }
    if footer:  # the tax wording (reverse charge, exemption) the invoice must carry
        params["footer"] = footer[:5000]
    stripe_invoice = _client().v1.invoices.create(
        params=params, options=_key("invoice", invoice_id, "create")
    )
    return stripe_invoice.id


def invoice_item_ids(*, stripe_invoice_id: str) -> dict[int, str]:
    """Our line id -> Stripe invoice item id, for the items already there."""
    out: dict[int, str] = {}
    client = _client()
    items = client.v1.invoice_items.list(params={"invoice": stripe_invoice_id, "limit": 100})
    for item in items.auto_paging_iter():
        line_id = (item.metadata.to_dict() if item.metadata else {}).get("ledger_line_id")
        if line_id:
            out[int(line_id)] = item.id
    return out


def invoice_item_create(
    *, invoice_id: int, customer: str, stripe_invoice_id: str, currency: str, item: ItemSpec
) -> str:
    params: dict[str, Any] = {
        "customer": customer,
        "invoice": stripe_invoice_id,
        "currency": currency.lower(),
        "amount": item.amount_minor,
        "description": item.description[:500],
        "period": {"start": item.period_start, "end": item.period_end},
        "metadata": {"ledger_invoice_id": str(invoice_id), "ledger_line_id": str(item.line_id)},
    }
    if item.tax_rates:
        params["tax_rates"] = list(item.tax_rates)
    created = _client().v1.invoice_items.create(
        params=params, options=_key("invoice", invoice_id, "line", item.line_id)
    )
    return created.id


def invoice_status(stripe_invoice_id: str) -> str:
    """A Stripe invoice's status now ("open", "paid", …)."""
    return str(_client().v1.invoices.retrieve(stripe_invoice_id).status)


def invoice_total(*, stripe_invoice_id: str) -> int:
    """A Stripe invoice's total as Stripe computes it (a draft's too): minor
    units, tax included."""
    return int(_client().v1.invoices.retrieve(stripe_invoice_id).total)


@dataclass(frozen=True)
class Finalized:
    status: str
    hosted_invoice_url: str
    total: int  # minor units, tax included, as Stripe computed it


def invoice_finalize(*, invoice_id: int, stripe_invoice_id: str) -> Finalized:
    """Finalize in Stripe: its status there, hosted invoice URL, total."""
    finalized = _client().v1.invoices.finalize_invoice(
        stripe_invoice_id,
        params={"auto_advance": False},
        options=_key("invoice", invoice_id, "finalize"),
    )
    return Finalized(finalized.status, finalized.hosted_invoice_url or "", int(finalized.total))


def invoice_pay_out_of_band(*, invoice_id: int, stripe_invoice_id: str) -> None:
    _client().v1.invoices.pay(
        stripe_invoice_id,
        params={"paid_out_of_band": True},
        options=_key("invoice", invoice_id, "paid"),
    )


def invoice_void(*, invoice_id: int, stripe_invoice_id: str) -> None:
    _client().v1.invoices.void_invoice(
        stripe_invoice_id, options=_key("invoice", invoice_id, "void")
    )


def invoice_mark_uncollectible(*, invoice_id: int, stripe_invoice_id: str) -> None:
    _client().v1.invoices.mark_uncollectible(
        stripe_invoice_id, options=_key("invoice", invoice_id, "uncollectible")
    )


def credit_note_create(
    *,
    credit_note_id: int,
    stripe_invoice_id: str,
    amount_minor: int,
    memo: str,
    paid: bool,
    tax: tuple[str, int] | None = None,
) -> str:
    """A credit note of `amount_minor` in all, of which `tax` (a Stripe tax
    rate id, minor units) is tax it reverses: then one line of the net with
    that exact tax amount, so Stripe's note splits as ours does, to the
    cent (Stripe would otherwise book the whole amount untaxed). On a paid
    invoice the amount went back to our own credit wallet: Stripe records
    it as settled out of band (not a refund, not a balance)."""
    params: dict[str, Any] = {
        "invoice": stripe_invoice_id,
        "memo": memo[:500],
        "metadata": {"ledger_credit_note_id": str(credit_note_id)},
    }
    if tax:
        rate, tax_minor = tax
        net = amount_minor - tax_minor
        params["lines"] = [
            {
                "type": "custom_line_item",
                "description": memo[:500],
                "quantity": 1,
                "unit_amount": net,
                "tax_amounts": [{"amount": tax_minor, "tax_rate": rate, "taxable_amount": net}],
            }
        ]
    else:
        params["amount"] = amount_minor
    if paid:
        params["out_of_band_amount"] = amount_minor
    note = _client().v1.credit_notes.create(
        params=params,
        options=_key("credit-note", credit_note_id),
    )
    return note.id


def webhook_event(*, payload: bytes, signature: str) -> dict[str, Any]:
    """The verified event as a plain dict; SignatureError when the
    signature is forged, missing or older than the tolerance (5 minutes)."""
    event = stripe.Webhook.construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET)
    return event.to_dict()
