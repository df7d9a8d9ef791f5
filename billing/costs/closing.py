"""Closed cost periods. Once an invoice is finalized, the hours up to the
end of its billing period are closed for cost: re-running their allocation
must price them as they were priced when reported (docs/features.md's promise),
so a dated cost rate may not take effect inside them. Finance reopens a
stretch with a reason (who and when are recorded, CostPeriodReopening);
a rate that takes effect inside a reopened stretch is accepted. What-if
scenarios never touch booked figures and are not held to this."""

from __future__ import annotations

from datetime import datetime

from django.db.models import Max

from billing.choices import InvoiceStatus
from billing.errors import BillingInputError, CostPeriodClosedError
from billing.models import CostPeriodReopening, Invoice

REASON_MAX = CostPeriodReopening._meta.get_field("reason").max_length


def cost_closed_until() -> datetime | None:
    """The end of the latest billing period with a finalized invoice (any
    tenant; a void one reopens nothing by itself): cost before it is closed."""
    return (
        Invoice.objects.exclude(status__in=[InvoiceStatus.DRAFT, InvoiceStatus.VOID])
        .aggregate(end=Max("period_end"))
        .get("end")
    )


def cost_change_check(*, effective_from: datetime) -> None:
    """Raise CostPeriodClosedError when a booked cost change taking effect
    at `effective_from` falls in a closed period not reopened."""
    closed_until = cost_closed_until()
    if closed_until is None or effective_from >= closed_until:
        return
    reopened = CostPeriodReopening.objects.filter(
        start__lte=effective_from, end__gt=effective_from
    ).exists()
    if not reopened:
        raise CostPeriodClosedError(effective_from=effective_from, closed_until=closed_until)


def cost_period_reopen(
    *, start: datetime, end: datetime, reason: str, user=None
) -> CostPeriodReopening:
    """Reopen [start, end) for dated cost changes, saying why."""
    reason = cost_period_reopen_check(start=start, end=end, reason=reason)
    return CostPeriodReopening.objects.create(start=start, end=end, reason=reason, reopened_by=user)


def cost_period_reopen_check(*, start: datetime, end: datetime, reason: str) -> str:
    """What is wrong with reopening [start, end), naming the field
    (BillingInputError); the reason as it is kept."""
    reason = (reason or "").strip()
    if not reason:
        raise BillingInputError("reason", "say why the period is reopened")
    if len(reason) > REASON_MAX:
        raise BillingInputError("reason", f"at most {REASON_MAX} characters")
    for name, moment in (("start", start), ("end", end)):
        if moment.tzinfo is None:
            raise BillingInputError(name, "must carry a timezone")
    if end <= start:
        raise BillingInputError("end", "must be after start")
    closed_until = cost_closed_until()
    if closed_until is None or start >= closed_until:
        raise BillingInputError("start", "nothing from here on is closed: no need to reopen it")
    return reason
