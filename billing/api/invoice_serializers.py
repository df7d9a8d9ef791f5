"""Input and output shapes of the invoice API. Amounts go out twice: as
integer minor units (for machines) and as a decimal string in the
currency's units (for people); never as a float."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from billing.choices import INVOICE_TARGET_STATUSES, InvoiceStatus
from billing.invoicing.credit_notes import REASON_MAX as CREDIT_NOTE_REASON_MAX
from billing.invoicing.finalizing import REASON_MAX as FINALIZE_EARLY_REASON_MAX
from billing.invoicing.invoices import invoice_amount_due_minor
from billing.models import CreditNote, Invoice, InvoiceLine, InvoiceRun
from billing.money import from_minor
from core.api_query import QueryIn
from core.api_schema import DECIMAL_STRING
from core.api_time import SupportedDateTimeField

# The services' words (credit_note_create, finalize_early_request), so the
# invoice page and the API refuse a long reason alike.
REASON_TOO_LONG = {"max_length": "at most {max_length} characters"}


@extend_schema_field(DECIMAL_STRING)
class MoneyField(serializers.Field):
    """Minor units (the attribute) as a decimal string in currency units."""

    def __init__(self, minor: str, **kwargs):
        self.minor = minor
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, obj) -> str:
        currency = obj.currency if hasattr(obj, "currency") else obj.invoice.currency
        return str(from_minor(getattr(obj, self.minor), currency))


class InvoiceLineOut(serializers.ModelSerializer):
    amount_billed = MoneyField("amount_minor")

    class Meta:
        model = InvoiceLine
        fields = [
            "position",
            "kind",
            "description",
            "quantity",
            "unit_price",
            "amount",
            "amount_minor",
            "amount_billed",
            "model",
            "token_kind",
            "book",
            "service_start",
            "service_end",
            "late",
            "sla_metric",
            "tax_percent",
            "tax_minor",
        ]


class CreditNoteOut(serializers.ModelSerializer):
    amount = MoneyField("amount_minor")

    class Meta:
        model = CreditNote
        fields = ["id", "number", "reason", "amount_minor", "amount", "tax_minor", "created_at"]


class InvoiceOut(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug")
    issuer = serializers.CharField(source="issuer.name")
    total = MoneyField("total_minor")
    amount_due_minor = serializers.SerializerMethodField()
    page_url = serializers.SerializerMethodField()

    class Meta:
        model = Invoice
        fields = [
            "id",
            "number",
            "status",
            "tenant",
            "issuer",
            "currency",
            "period_start",
            "period_end",
            "subtotal_minor",
            "tax_minor",
            "total_minor",
            "total",
            "tax_treatment",
            "tax_note",
            "buyer_country",
            "buyer_tax_id",
            "amount_due_minor",
            "finalized_at",
            "finalized_early_by",
            "finalized_early_reason",
            "due_at",
            "paid_at",
            "voided_at",
            "uncollectible_at",
            "stripe_sync",
            "hosted_invoice_url",
            "warnings",
            "page_url",
        ]

    def get_amount_due_minor(self, invoice) -> int:
        return invoice_amount_due_minor(invoice)

    def get_page_url(self, invoice) -> str:
        return f"/invoices/{invoice.pk}/"


class InvoiceDetailOut(InvoiceOut):
    lines = InvoiceLineOut(many=True)
    credit_notes = CreditNoteOut(many=True)

    class Meta(InvoiceOut.Meta):
        fields = [*InvoiceOut.Meta.fields, "lines", "credit_notes"]


class InvoiceListQueryIn(QueryIn):
    status = serializers.ChoiceField(choices=InvoiceStatus.choices, required=False)
    tenant = serializers.SlugField(required=False, help_text="Finance staff only.")


class FinalizeEarlyIn(serializers.Serializer):
    finalize_early = serializers.BooleanField(
        default=False,
        help_text="Finalize although the billing period has not ended (needs a reason, "
        "recorded on the invoice). Without it such a finalize is refused with 409.",
    )
    reason = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=FINALIZE_EARLY_REASON_MAX,
        error_messages=REASON_TOO_LONG,
        help_text="Why finalize early; required with finalize_early.",
    )


class InvoiceTransitionIn(FinalizeEarlyIn):
    status = serializers.ChoiceField(
        choices=INVOICE_TARGET_STATUSES,
        help_text="finalized (from draft), or paid / void / uncollectible.",
    )


class CreditNoteIn(serializers.Serializer):
    amount_minor = serializers.IntegerField(min_value=1)
    reason = serializers.CharField(
        max_length=CREDIT_NOTE_REASON_MAX, error_messages=REASON_TOO_LONG
    )


class InvoiceRunIn(FinalizeEarlyIn):
    as_of = SupportedDateTimeField(
        required=False,
        help_text="Invoice periods that ended by then (default: now). Later than now, it "
        "picks periods that have not ended: refused (409) unless finalize is false or "
        "finalize_early is true with a reason.",
    )
    finalize = serializers.BooleanField(default=True)


class InvoiceRunOut(serializers.ModelSerializer):
    class Meta:
        model = InvoiceRun
        fields = [
            "id",
            "as_of",
            "status",
            "finalize",
            "finalize_early_reason",
            "finalize_early_by",
            "tenants_total",
            "tenants_done",
            "invoices_created",
            "invoices_skipped",
            "failures",
            "warnings",
            "created_at",
            "started_at",
            "finished_at",
        ]


class CreditBalanceOut(serializers.Serializer):
    grant = serializers.IntegerField(source="grant.pk")
    currency = serializers.CharField(source="grant.currency")
    granted_at = serializers.DateTimeField(source="grant.granted_at")
    expires_at = serializers.DateTimeField(source="grant.expires_at", allow_null=True)
    note = serializers.CharField(source="grant.note")
    remaining_minor = serializers.IntegerField()
