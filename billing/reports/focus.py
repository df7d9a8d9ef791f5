"""What tenants are billed, as a FOCUS 1.2 dataset: one row per invoice
line and per credit note, so that BilledCost summed per InvoiceId is the
invoice's total (or the credit note's amount, negative) to the cent.

- Tax is its own row (ChargeCategory Tax), one per rate an invoice's
  lines carry; a credit note's share of tax is a Tax row of class
  Correction beside its Credit row (the two sum to the note's amount).
- A billing period with an issued invoice (finalized, paid or
  uncollectible) is read from that invoice: `x_BillingStatus` "invoiced",
  `InvoiceId` its number. Credit notes on it are Credit rows of class
  Correction with the credit note's number as `InvoiceId`.
- A period without one (the running period, or one not invoiced yet) is
  rated now by the code that builds invoices (`draft_compose`): usage so
  far, the period's fees, true-up and late usage, as a draft would bill
  them. `x_BillingStatus` "unbilled"; its `InvoiceId` names it as a
  provisional invoice ("provisional-<tenant>-<period start>"), which
  FOCUS allows, so its rows also sum to what the period comes to so far.

Line kinds map to charge categories: token and GPU-second usage is Usage
(usage-based), and so are reservation and dedicated-GPU fees (recurring):
they pay for capacity held in the same period, not ahead for later
charges, which FOCUS's Purchase means (a Purchase's EffectiveCost is 0,
its cost amortised into the usage it covers). The plan's commitment
true-up is an Adjustment; the plan discount, prepaid credit and SLA
credits are Credit. A late-usage line (usage of an earlier period billed
in this one) has class Correction and the earlier period as its charge
period.

Prices: a tenant's price book (its tier's) is its contract, so
ListUnitPrice = ContractedUnitPrice = the book's price, and
ListCost = ContractedCost = that price times PricingQuantity, exactly.
The plan's discount is its own Credit row, as on the invoice (were it also
taken off ContractedCost, summing the column would count it twice).
EffectiveCost = BilledCost: nothing here is bought up front and amortised.
BilledCost is the line's amount as billed, in whole minor units."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.utils import timezone

from billing.choices import InvoiceStatus, LineKind
from billing.invoicing.invoices import draft_compose, invoicing_session
from billing.models import Invoice, Issuer
from billing.money import from_minor
from billing.pricing.periods import tenant_period
from billing.pricing.rate_card import MILLION
from billing.pricing.rating import rating_inputs
from billing.reports.focus_columns import (
    COMMITMENT_COLUMNS,
    SERVICE_CATEGORY,
    focus_amount,
    focus_decimal,
    focus_tags,
    focus_time,
)
from billing.tax.services import tax_by_rate
from tenants.models import Tenant

SERVICE_NAME = "LLM Inference"
SERVICE_SUBCATEGORY = "Generative AI"
ISSUED = (InvoiceStatus.FINALIZED, InvoiceStatus.PAID, InvoiceStatus.UNCOLLECTIBLE)


@dataclass(frozen=True)
class Kind:
    """How one kind of invoice line reads in FOCUS."""

    category: str
    frequency: str
    pricing_unit: str | None = None  # None: no unit price (credits, adjustments)
    per: Decimal = Decimal(1)  # the line's quantity per pricing unit
    consumed_unit: str | None = None  # Usage rows only
    meter: str | None = None


TOKEN_METERS = {
    "input": "Input Tokens",
    "cached_input": "Cached Input Tokens",
    "output": "Output Tokens",
}
KINDS = {  # by the kind stored on the line
    LineKind.TOKENS.value: Kind("Usage", "Usage-Based", "1000000 Tokens", MILLION, "Tokens"),
    LineKind.GPU_SECONDS.value: Kind(
        "Usage", "Usage-Based", "GPU-Seconds", consumed_unit="GPU-Seconds", meter="GPU-Seconds"
    ),
    LineKind.RESERVATION.value: Kind(
        "Usage", "Recurring", "GPU-Hours", consumed_unit="GPU-Hours", meter="Reserved GPU-Hours"
    ),
    LineKind.DEDICATED.value: Kind(
        "Usage", "Recurring", "GPU-Months", consumed_unit="GPU-Months", meter="Dedicated GPU-Months"
    ),
    LineKind.DISCOUNT.value: Kind("Credit", "Usage-Based"),
    LineKind.COMMIT_TRUE_UP.value: Kind("Adjustment", "Recurring"),
    LineKind.CREDIT.value: Kind("Credit", "One-Time"),
    LineKind.SLA_CREDIT.value: Kind("Credit", "One-Time"),
}


@dataclass(frozen=True)
class Billing:
    """Whose bill a row is on: the columns every row of one invoice (or
    one rated period) shares."""

    tenant: Tenant
    currency: str
    period_start: datetime
    period_end: datetime
    issuer: str
    invoice_id: str | None
    status: str  # x_BillingStatus

    def columns(self) -> dict:
        return {
            "BillingAccountId": self.tenant.slug,
            "BillingAccountName": self.tenant.name,
            "BillingCurrency": self.currency,
            "BillingPeriodStart": focus_time(self.period_start),
            "BillingPeriodEnd": focus_time(self.period_end),
            "InvoiceId": self.invoice_id,
            "InvoiceIssuerName": self.issuer,
            "ProviderName": self.issuer,
            "PublisherName": self.issuer,
            "RegionId": None,
            "RegionName": None,
            "ServiceCategory": SERVICE_CATEGORY,
            "ServiceName": SERVICE_NAME,
            "ServiceSubcategory": SERVICE_SUBCATEGORY,
            "SubAccountId": self.tenant.slug,
            "SubAccountName": self.tenant.name,
            "x_BillingStatus": self.status,
            **dict.fromkeys(COMMITMENT_COLUMNS),
        }


def focus_billing_rows(
    *, tenant: Tenant | None, start: datetime, end: datetime, now: datetime | None = None
) -> Iterator[dict]:
    """Every billing period overlapping [start, end), whole: an issued
    invoice's lines and credit notes, else the period rated as it stands
    (periods that have not begun by `now` have nothing yet)."""
    now = now or timezone.now()
    tenants = [tenant] if tenant is not None else list(Tenant.objects.order_by("slug"))
    invoices = _issued(tenants=tenants, start=start, end=end)
    with invoicing_session():
        for t in tenants:
            for invoice in invoices[t.pk]:
                yield from invoice_rows(invoice)
            billed = [(i.period_start, i.period_end) for i in invoices[t.pk]]
            # Every draft after the last issued invoice finds the same late
            # usage of the invoiced periods; the next invoice bills it once,
            # so only the first unbilled period that finds it carries it.
            late_carried = False
            for period_start, period_end in _periods(t, start=start, end=min(end, now)):
                if any(s < period_end and period_start < e for s, e in billed):
                    continue
                unbilled = _unbilled(t, period_start, period_end)
                if unbilled is None:
                    continue
                billing, lines = unbilled
                if late_carried:
                    lines = [line for line in lines if not line.late]
                late_carried = late_carried or any(line.late for line in lines)
                yield from line_rows(lines, billing=billing)


def invoice_rows(invoice: Invoice) -> Iterator[dict]:
    """An issued invoice's lines, then its credit notes."""
    billing = Billing(
        tenant=invoice.tenant,
        currency=invoice.currency,
        period_start=invoice.period_start,
        period_end=invoice.period_end,
        issuer=invoice.issuer.name,
        invoice_id=invoice.number,
        status="invoiced",
    )
    yield from line_rows(invoice.lines.all(), billing=billing)
    for note in invoice.credit_notes.order_by("sequence"):
        net = note.amount_minor - note.tax_minor
        yield {
            **billing.columns(),
            **_unpriced(focus_amount(-from_minor(net, invoice.currency), invoice.currency)),
            "ChargeCategory": "Credit",
            "ChargeClass": "Correction",
            "ChargeDescription": f"Credit note {note.number} on {invoice.number}: {note.reason}",
            "ChargeFrequency": "One-Time",
            "ChargePeriodStart": focus_time(invoice.period_start),
            "ChargePeriodEnd": focus_time(invoice.period_end),
            "InvoiceId": note.number,
            "Tags": focus_tags({"tier": invoice.tenant.tier, "corrects": invoice.number}),
        }
        if note.tax_minor:
            yield _tax_row(
                billing,
                minor=-note.tax_minor,
                description=f"Tax reversed by credit note {note.number} on {invoice.number}",
                ChargeClass="Correction",
                InvoiceId=note.number,
                Tags=focus_tags({"tier": invoice.tenant.tier, "corrects": invoice.number}),
            )


def line_rows(lines: Iterable, *, billing: Billing) -> Iterator[dict]:
    """Invoice lines (stored, or drafts as rated) as FOCUS rows, then their
    tax: a Tax row per rate."""
    lines = list(lines)
    for line in lines:
        kind = KINDS[line.kind]
        billed = focus_amount(from_minor(line.amount_minor, billing.currency), billing.currency)
        row = {
            **billing.columns(),
            "ChargeCategory": kind.category,
            "ChargeClass": "Correction" if line.late else None,
            "ChargeDescription": line.description,
            "ChargeFrequency": kind.frequency,
            "ChargePeriodStart": focus_time(line.service_start),
            "ChargePeriodEnd": focus_time(line.service_end),
            "ResourceId": line.model or None,
            "ResourceName": line.model or None,
            "ResourceType": "Model" if line.model else None,
            "Tags": focus_tags({"tier": billing.tenant.tier, "line_kind": line.kind}),
        }
        if kind.pricing_unit is None or line.unit_price is None:
            row |= _unpriced(billed)
        else:
            row |= _priced(line, kind, billed=billed, currency=billing.currency)
        yield row
    yield from _tax_rows(lines, billing=billing)


def _tax_rows(lines: list, *, billing: Billing) -> Iterator[dict]:
    for taxed in tax_by_rate(lines):
        if taxed.tax_minor:
            yield _tax_row(
                billing, minor=taxed.tax_minor, description=f"{taxed.rate.label} on usage"
            )


def _tax_row(billing: Billing, *, minor: int, description: str, **columns) -> dict:
    """Tax as FOCUS has it: its own charge category, one amount."""
    return {
        **billing.columns(),
        **_unpriced(focus_amount(from_minor(minor, billing.currency), billing.currency)),
        "ChargeCategory": "Tax",
        "ChargeClass": None,
        "ChargeDescription": description,
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": focus_time(billing.period_start),
        "ChargePeriodEnd": focus_time(billing.period_end),
        "Tags": focus_tags({"tier": billing.tenant.tier, "line_kind": "tax"}),
        **columns,
    }


def _priced(line, kind: Kind, *, billed: Decimal, currency: str) -> dict:
    quantity = focus_decimal(Decimal(line.quantity) / kind.per)
    unit = focus_decimal(line.unit_price, currency)
    cost = focus_decimal(unit * quantity, currency)
    sku = f"{line.model}/{line.token_kind}" if line.token_kind else (line.model or line.kind)
    usage = kind.category == "Usage"
    return {
        "BilledCost": billed,
        "EffectiveCost": billed,
        "ListCost": cost,
        "ContractedCost": cost,
        "ListUnitPrice": unit,
        "ContractedUnitPrice": unit,
        "PricingCategory": "Standard",
        "PricingQuantity": quantity,
        "PricingUnit": kind.pricing_unit,
        "ConsumedQuantity": focus_decimal(line.quantity) if usage else None,
        "ConsumedUnit": kind.consumed_unit if usage else None,
        "SkuId": sku,
        "SkuMeter": TOKEN_METERS.get(line.token_kind) or kind.meter,
        "SkuPriceId": f"{line.book}/{sku}@{unit}",
    }


def _unpriced(amount: Decimal) -> dict:
    """A credit or adjustment: one amount in every cost column."""
    return {
        "BilledCost": amount,
        "EffectiveCost": amount,
        "ListCost": amount,
        "ContractedCost": amount,
        **dict.fromkeys(
            (
                "ListUnitPrice",
                "ContractedUnitPrice",
                "PricingCategory",
                "PricingQuantity",
                "PricingUnit",
                "ConsumedQuantity",
                "ConsumedUnit",
                "ResourceId",
                "ResourceName",
                "ResourceType",
                "SkuId",
                "SkuMeter",
                "SkuPriceId",
            )
        ),
    }


def _issued(*, tenants: list[Tenant], start: datetime, end: datetime) -> dict[int, list[Invoice]]:
    out: dict[int, list[Invoice]] = defaultdict(list)
    invoices = (
        Invoice.objects.filter(
            tenant__in=tenants, status__in=ISSUED, period_start__lt=end, period_end__gt=start
        )
        .select_related("tenant", "issuer")
        .order_by("period_start", "pk")
    )
    for invoice in invoices:
        out[invoice.tenant_id].append(invoice)
    return out


def _periods(tenant: Tenant, *, start: datetime, end: datetime) -> Iterator[tuple]:
    moment = start
    while moment < end:
        period = tenant_period(tenant=tenant, moment=moment)
        yield period
        moment = period[1]


def _unbilled(tenant: Tenant, start: datetime, end: datetime) -> tuple[Billing, list] | None:
    """A period rated as it stands: whose bill it would be, and its lines
    (None: nothing to bill)."""
    inputs = rating_inputs(tenants=[tenant], start=start, end=end)[tenant.pk]
    content = draft_compose(tenant=tenant, start=start, end=end, inputs=inputs)
    if content is None:
        return None
    billing = Billing(
        tenant=tenant,
        currency=tenant.billing_currency,
        period_start=start,
        period_end=end,
        issuer=Issuer.objects.get(pk=content.issuer_id).name,
        invoice_id=f"provisional-{tenant.slug}-{start:%Y%m%d}",
        status="unbilled",
    )
    return billing, content.lines
