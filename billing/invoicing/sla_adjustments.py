"""Finance's decisions on SLA credits: waive a credit, or set another
percent of the usage charges, with a reason; recorded with who and when
(SlaCreditAdjustment rows, never edited: a later decision is a new row,
the newest counts). Only while the period's invoice is a draft: a
finalized invoice never changes (invariant 4), so what is owed after
that is a credit note. The draft is rebuilt at once, in the same
transaction, so its lines show the decision."""

from __future__ import annotations

from decimal import Decimal

from django.db import transaction

from billing.choices import InvoiceStatus, LineKind, SlaAdjustmentAction, SloMetric
from billing.errors import BillingInputError, InvoiceStateError
from billing.invoicing.invoices import invoice_draft_build
from billing.models import Invoice, SlaCreditAdjustment
from core.errors import InputError
from core.plain_decimal import plain_decimal
from tenants.models import Tenant

REASON_MAX = 300


def sla_credit_adjust(
    *,
    invoice_id: int,
    metric: str,
    action: str,
    reason: str,
    credit_percent: Decimal | str | None = None,
    by=None,
) -> SlaCreditAdjustment:
    """Record finance's decision on the draft's SLA credit for `metric`
    and rebuild the draft. 400 (BillingInputError) for bad input or a
    metric the invoice has no credit for; 409 (InvoiceStateError) once the
    invoice is finalized."""
    metric, action, reason, percent = _checked(metric, action, reason, credit_percent)
    with transaction.atomic():
        # The lock order of invoicing: the tenant, then its invoice.
        tenant_id = Invoice.objects.values_list("tenant_id", flat=True).get(pk=invoice_id)
        tenant = Tenant.objects.select_for_update().get(pk=tenant_id)
        invoice = (
            Invoice.objects.select_for_update(of=("self",)).select_related("run").get(pk=invoice_id)
        )
        if invoice.status != InvoiceStatus.DRAFT:
            raise InvoiceStateError(
                f"invoice {invoice} is {invoice.status}: a finalized invoice never changes, "
                "so its SLA credits cannot be adjusted (issue a credit note instead)"
            )
        credited = invoice.lines.filter(kind=LineKind.SLA_CREDIT, sla_metric=metric).exists()
        decided = SlaCreditAdjustment.objects.filter(
            tenant=tenant, period_start=invoice.period_start, metric=metric
        ).exists()
        if not credited and not decided:
            raise BillingInputError("metric", f"this invoice has no SLA credit for {metric}")
        adjustment = SlaCreditAdjustment.objects.create(
            tenant=tenant,
            period_start=invoice.period_start,
            metric=metric,
            action=action,
            credit_percent=percent,
            reason=reason,
            created_by=by,
        )
        invoice_draft_build(
            tenant=tenant,
            period_start=invoice.period_start,
            period_end=invoice.period_end,
            run=invoice.run,
        )
    return adjustment


def _checked(metric, action, reason, credit_percent) -> tuple[str, str, str, Decimal | None]:
    if metric not in SloMetric.values:
        raise BillingInputError("metric", f"one of {', '.join(SloMetric.values)}")
    if action not in SlaAdjustmentAction.values:
        raise BillingInputError("action", f"one of {', '.join(SlaAdjustmentAction.values)}")
    reason = (reason or "").strip()
    if not reason:
        raise BillingInputError("reason", "a waiver or an adjustment needs a reason (recorded)")
    if len(reason) > REASON_MAX:
        raise BillingInputError("reason", f"at most {REASON_MAX} characters")
    if action == SlaAdjustmentAction.WAIVE:
        if credit_percent not in (None, ""):
            raise BillingInputError("credit_percent", "a waiver takes no percent")
        return metric, action, reason, None
    if credit_percent is None:
        raise BillingInputError("credit_percent", "a percent from 0 to 100")
    try:
        percent = plain_decimal(credit_percent, field="credit_percent", places=2, max_digits=5)
    except InputError as error:
        raise BillingInputError(error.field, error.message) from None
    if not 0 <= percent <= 100:
        raise BillingInputError("credit_percent", "a percent from 0 to 100")
    return metric, action, reason, percent
