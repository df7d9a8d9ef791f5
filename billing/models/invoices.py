"""Invoices: who issues them, the runs that make them, their lines, credit
notes that correct them, prepaid credit spent on them. Amounts a tenant
owes are integer minor units of the invoice's currency; each line keeps
the exact Decimal it was rounded from.

A finalized invoice and its lines are immutable: the database refuses the
change (a trigger, see migration 0004), not only the code."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import F, Q

from billing.choices import InvoiceStatus, LineKind, RunStatus, StripeSync
from billing.models.prices import CreditGrant
from billing.models.runs import RunLifecycle
from billing.money import UNIT_PRICE_PLACES
from tenants.models import Tenant

EXACT = {"max_digits": 38, "decimal_places": 12}  # unrounded amounts (invariant 1)
QUANTITY = {"max_digits": 30, "decimal_places": 9}


class Issuer(models.Model):
    """The legal entity that issues invoices. Invoice and credit-note
    numbers run per issuer, without gaps: a number is taken under this
    row's lock in the transaction that finalizes, so a rollback gives it
    back."""

    name = models.CharField(max_length=200, unique=True)
    address = models.TextField(blank=True, default="")
    tax_id = models.CharField(max_length=64, blank=True, default="")
    # Where the issuer is established (ISO 3166-1 alpha-2): an EU issuer
    # selling to a business in another EU country reverse-charges its VAT.
    country = models.CharField(max_length=2, blank=True, default="")
    invoice_prefix = models.CharField(max_length=16, default="INV")
    credit_note_prefix = models.CharField(max_length=16, default="CN")
    next_invoice_number = models.PositiveBigIntegerField(default=1)
    next_credit_note_number = models.PositiveBigIntegerField(default=1)
    is_default = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["is_default"], condition=Q(is_default=True), name="issuer_one_default"
            )
        ]

    def __str__(self) -> str:
        return self.name


class InvoiceRun(RunLifecycle):
    """One run of invoicing: every tenant whose billing period ended by
    `as_of` gets that period's invoice. Each tenant is one transaction;
    re-running skips what is finalized and rebuilds drafts. Progress
    (tenants done of tenants to do) is for a person to watch."""

    as_of = models.DateTimeField()
    finalize = models.BooleanField(default=True)
    tenants_total = models.PositiveIntegerField(default=0)
    tenants_done = models.PositiveIntegerField(default=0)
    invoices_created = models.PositiveIntegerField(default=0)
    invoices_skipped = models.PositiveIntegerField(default=0)
    failures = models.JSONField(default=list, blank=True)  # [{tenant, error}]
    warnings = models.JSONField(default=list, blank=True)
    # Asked to finalize periods that have not ended yet: why, and who asked
    # (copied onto each invoice it finalizes early).
    finalize_early_reason = models.CharField(max_length=300, blank=True, default="")
    finalize_early_by = models.CharField(max_length=200, blank=True, default="")
    started_at = models.DateTimeField(null=True, blank=True)
    # When the invoices it finalizes are issued (finalized_at; due NET_DAYS
    # later): empty is the moment each is finalized. Set for a backfill of
    # past months (the demo's history, an import), never in the future.
    issued_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=RunStatus.values), name="invoicerun_status"
            ),
            models.CheckConstraint(
                condition=Q(finalize_early_reason="") | Q(finalize=True),
                name="invoicerun_early_only_when_finalizing",
            ),
        ]

    def __str__(self) -> str:
        return f"invoice run as of {self.as_of:%Y-%m-%d} ({self.status})"

    @classmethod
    def failed_because(cls, reason: str) -> dict[str, object]:
        return {"failures": [{"tenant": "", "error": reason}]}


class Invoice(models.Model):
    """What a tenant owes for one billing period [period_start, period_end).
    The lines sum to `total_minor`; credit notes reduce what is due."""

    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="invoices")
    issuer = models.ForeignKey(Issuer, on_delete=models.PROTECT, related_name="invoices")
    run = models.ForeignKey(
        InvoiceRun, null=True, blank=True, on_delete=models.SET_NULL, related_name="invoices"
    )
    status = models.CharField(
        max_length=16, choices=InvoiceStatus.choices, default=InvoiceStatus.DRAFT
    )
    sequence = models.PositiveBigIntegerField(null=True, blank=True, editable=False)
    number = models.CharField(max_length=40, blank=True, default="", editable=False)
    currency = models.CharField(max_length=3)
    period_start = models.DateTimeField()
    period_end = models.DateTimeField()
    # What is due: the lines before tax (subtotal, prepaid credit apart),
    # plus the tax on them, less the prepaid credit applied.
    subtotal_minor = models.BigIntegerField(default=0)
    tax_minor = models.BigIntegerField(default=0)
    total_minor = models.BigIntegerField(default=0)
    # How tax was decided when it was rated (billing.tax.rules): "" none,
    # standard, reverse_charge or exempt; the wording the invoice carries;
    # the buyer as the tax profile had it then.
    tax_treatment = models.CharField(max_length=16, blank=True, default="")
    tax_note = models.CharField(max_length=500, blank=True, default="")
    buyer_country = models.CharField(max_length=2, blank=True, default="")
    buyer_tax_id = models.CharField(max_length=64, blank=True, default="")
    # What usage the period had when rated: a later difference means late usage.
    usage_fingerprint = models.JSONField(default=dict, blank=True)
    warnings = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    rated_at = models.DateTimeField(null=True, blank=True)
    finalized_at = models.DateTimeField(null=True, blank=True)
    due_at = models.DateTimeField(null=True, blank=True)
    paid_at = models.DateTimeField(null=True, blank=True)
    voided_at = models.DateTimeField(null=True, blank=True)
    uncollectible_at = models.DateTimeField(null=True, blank=True)
    stripe_invoice_id = models.CharField(max_length=255, blank=True, default="")
    stripe_sync = models.CharField(
        max_length=16, choices=StripeSync.choices, default=StripeSync.NOT_SYNCED
    )
    stripe_status = models.CharField(max_length=16, blank=True, default="")
    stripe_error = models.TextField(blank=True, default="")
    payment_failed_at = models.DateTimeField(null=True, blank=True)
    hosted_invoice_url = models.URLField(max_length=500, blank=True, default="")
    # Finalized before its period ended (finalized_at says when): who asked
    # and why. Immutable once finalized, like the rest (migration 0011).
    finalized_early_by = models.CharField(max_length=200, blank=True, default="")
    finalized_early_reason = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-period_start", "tenant_id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=InvoiceStatus.values), name="invoice_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(period_end__gt=F("period_start")), name="invoice_period"
            ),
            models.CheckConstraint(
                condition=Q(status=InvoiceStatus.DRAFT) | Q(sequence__isnull=False),
                name="invoice_numbered_when_final",
            ),
            # One live invoice per tenant and period; a void one may be redone.
            models.UniqueConstraint(
                fields=["tenant", "period_start"],
                condition=~Q(status=InvoiceStatus.VOID),
                name="invoice_one_per_period",
            ),
            models.UniqueConstraint(fields=["issuer", "sequence"], name="invoice_number_unique"),
            models.CheckConstraint(
                condition=Q(finalized_early_reason="") | Q(sequence__isnull=False),
                name="invoice_early_only_when_numbered",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "-period_start"], name="invoice_tenant")]

    def __str__(self) -> str:
        return self.number or f"draft #{self.pk}"

    @property
    def is_final(self) -> bool:
        return self.status != InvoiceStatus.DRAFT

    @property
    def finalized_early(self) -> bool:
        return bool(self.finalized_early_reason)

    @property
    def credited_in_full(self) -> bool:
        """Settled by credit notes, not paid: notes issued while it was
        open (a note on a paid invoice refunds to the wallet instead) cover
        the whole total, which moved it to paid (credit_note_create)."""
        credited = sum(
            note.amount_minor for note in self.credit_notes.all() if note.wallet_grant_id is None
        )
        return self.status == InvoiceStatus.PAID and 0 < self.total_minor <= credited

    @property
    def status_label(self) -> str:
        """The status as people read it: "Credited", not "Paid", for one
        settled by credit notes."""
        return "Credited" if self.credited_in_full else self.get_status_display()


class InvoiceLine(models.Model):
    """One line: `quantity` at `unit_price`, exactly `amount`, billed as
    `amount_minor` (rounded once, half-even). A late-usage adjustment
    (`late`) is the difference between an earlier period rated again and
    what was billed for it; service_start/service_end name that period. An
    SLA credit (kind sla_credit) is a percent of the period's usage
    charges, for the missed target `sla_metric`."""

    invoice = models.ForeignKey(Invoice, on_delete=models.CASCADE, related_name="lines")
    position = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=LineKind.choices)
    description = models.CharField(max_length=300)
    quantity = models.DecimalField(**QUANTITY)
    unit_price = models.DecimalField(
        max_digits=24, decimal_places=UNIT_PRICE_PLACES, null=True, blank=True
    )
    amount = models.DecimalField(**EXACT)
    amount_minor = models.BigIntegerField()
    model = models.CharField(max_length=200, blank=True, default="")
    token_kind = models.CharField(max_length=16, blank=True, default="")
    book = models.CharField(max_length=120, blank=True, default="")
    service_start = models.DateTimeField()
    service_end = models.DateTimeField()
    late = models.BooleanField(default=False)
    # An SLA credit line: the metric whose missed target it credits.
    sla_metric = models.CharField(max_length=16, blank=True, default="")
    # The tax on this line: the rate (and its percent as it was), rounded
    # once per line (billing.tax.rules.TAX_ROUNDING); none on prepaid credit.
    tax_rate = models.ForeignKey(
        "billing.TaxRate", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    tax_percent = models.DecimalField(max_digits=7, decimal_places=4, null=True, blank=True)
    tax_minor = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["invoice", "position"]
        constraints = [
            models.UniqueConstraint(fields=["invoice", "position"], name="invoiceline_position"),
            models.CheckConstraint(condition=Q(kind__in=LineKind.values), name="line_kind_valid"),
        ]

    def __str__(self) -> str:
        return self.description


class CreditNote(models.Model):
    """A correction of a finalized invoice: reduces what is due (or, once
    paid, returns the amount to the tenant's credit wallet). Numbered per
    issuer like invoices, and immutable."""

    invoice = models.ForeignKey(Invoice, on_delete=models.PROTECT, related_name="credit_notes")
    issuer = models.ForeignKey(Issuer, on_delete=models.PROTECT, related_name="credit_notes")
    sequence = models.PositiveBigIntegerField(editable=False)
    number = models.CharField(max_length=40, editable=False)
    reason = models.CharField(max_length=300)
    amount_minor = models.BigIntegerField(validators=[MinValueValidator(1)])
    # The share of amount_minor that reverses the invoice's tax.
    tax_minor = models.BigIntegerField(default=0)
    wallet_grant = models.OneToOneField(
        CreditGrant, null=True, blank=True, on_delete=models.PROTECT, related_name="credit_note"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    stripe_credit_note_id = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditnote_positive"),
            models.UniqueConstraint(fields=["issuer", "sequence"], name="creditnote_number_unique"),
        ]

    def __str__(self) -> str:
        return self.number


class CreditApplication(models.Model):
    """Prepaid credit spent on an invoice (a ledger row, never edited). A
    grant's balance is its amount less what non-void invoices spent."""

    grant = models.ForeignKey(CreditGrant, on_delete=models.PROTECT, related_name="applications")
    invoice = models.ForeignKey(
        Invoice, on_delete=models.CASCADE, related_name="credit_applications"
    )
    amount_minor = models.BigIntegerField(validators=[MinValueValidator(1)])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["grant", "invoice"], name="creditapp_once"),
            models.CheckConstraint(condition=Q(amount_minor__gt=0), name="creditapp_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.amount_minor} of grant {self.grant_id} on invoice {self.invoice_id}"


class StripeEvent(models.Model):
    """A webhook event from Stripe, stored by its id before it is handled, so
    a redelivery is recognised and handled once."""

    event_id = models.CharField(max_length=255, unique=True)
    type = models.CharField(max_length=100)
    created = models.DateTimeField(help_text="When Stripe created the event.")
    payload = models.JSONField()
    received_at = models.DateTimeField(auto_now_add=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=300, blank=True, default="")

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"{self.type} {self.event_id}"


class ReproductionCheck(models.Model):
    """One run of the standing check that re-rating closed periods gives
    what was billed for them (billing.invoicing.reproduction): how many
    finalized invoices it re-rated, how many wait on late usage not yet
    billed, and each difference found (expected: none)."""

    checked_at = models.DateTimeField(auto_now_add=True)
    invoices = models.PositiveIntegerField(default=0)
    pending_late_usage = models.PositiveIntegerField(default=0)
    differences = models.JSONField(default=list, blank=True)

    class Meta:
        ordering = ["-checked_at"]

    def __str__(self) -> str:
        return f"{self.checked_at:%Y-%m-%d %H:%M}: {len(self.differences)} differences"
