"""What billing tells tenants and the operator of (webhooks.event_emit):
invoices finalized, paid or failing payment, prepaid credit running low,
a service level missed over a day. Each is emitted in the transaction
that made it so, once (its key)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.conf import settings
from django.utils import timezone

from billing.choices import InvoiceStatus
from billing.models import CreditGrant, Invoice
from billing.money import from_minor, money_format, to_minor
from billing.sla.selectors import slo_compliance
from billing.spend.wallet import grant_in_force, wallet_balances_many
from tenants.models import Tenant
from webhooks.choices import EventType
from webhooks.services import EventDraft, event_emit, events_emit


def _invoice_data(invoice: Invoice) -> dict:
    return {
        "invoice_id": invoice.pk,
        "number": invoice.number,
        "status": invoice.status,
        "currency": invoice.currency,
        "total": str(from_minor(invoice.total_minor, invoice.currency)),
        "total_minor": invoice.total_minor,
        "subtotal_minor": invoice.subtotal_minor,
        "tax_minor": invoice.tax_minor,
        "period_start": invoice.period_start.isoformat(),
        "period_end": invoice.period_end.isoformat(),
        "due_at": invoice.due_at.isoformat() if invoice.due_at else None,
    }


def _invoice_event(invoice: Invoice, type: EventType, *, tenant: Tenant) -> EventDraft:
    total = money_format(invoice.total_minor, invoice.currency)
    what = {
        EventType.INVOICE_FINALIZED: f"invoice {invoice.number} issued for {total}",
        EventType.INVOICE_PAID: f"invoice {invoice.number} paid ({total})",
        EventType.INVOICE_PAYMENT_FAILED: f"payment of invoice {invoice.number} ({total}) failed",
    }[type]
    key = f"{type}:{invoice.pk}"
    if type == EventType.INVOICE_PAYMENT_FAILED:  # each failed attempt is news
        key += f":{invoice.payment_failed_at.isoformat()}"
    return EventDraft(type, tenant, key, f"{tenant.name}: {what}", _invoice_data(invoice))


def invoice_event_emit(invoice: Invoice, type: EventType) -> None:
    events_emit([_invoice_event(invoice, type, tenant=invoice.tenant)])


def invoices_moved_emit(moves: Mapping[str, Iterable[Invoice]]) -> None:
    """Drafts just finalized (a zero invoice moves straight on to paid)."""
    tenants: dict[int, Tenant] = {}
    drafts = []
    for status, invoices in moves.items():
        for invoice in invoices:
            tenant = tenants.setdefault(invoice.tenant_id, invoice.tenant)
            drafts.append(_invoice_event(invoice, EventType.INVOICE_FINALIZED, tenant=tenant))
            if status == InvoiceStatus.PAID:
                drafts.append(_invoice_event(invoice, EventType.INVOICE_PAID, tenant=tenant))
    events_emit(drafts)


def credit_low_check(
    *,
    tenant_ids: Iterable[int],
    unbilled: Mapping[int, Decimal] | None = None,
    now: datetime | None = None,
) -> list[int]:
    """credit.low for each tenant whose prepaid credit left, in one
    currency, is at or under WEBHOOKS_CREDIT_LOW_PERCENT of its grants in
    force at `now` (granted, not expired: what the gateway holds it to),
    once per newest grant: a new grant arms it again. Left is what those
    grants hold less `unbilled`: a tenant's usage no invoice has drawn yet,
    in its billing currency (the spend corrections' ledger figure), so
    credit running low mid-month is told before the gateway refuses. The
    tenants told."""
    percent = settings.WEBHOOKS["CREDIT_LOW_PERCENT"]
    now = now or timezone.now()
    tenant_ids = sorted(set(tenant_ids))
    grants: dict[tuple[int, str], list] = {}
    for grant in CreditGrant.objects.filter(tenant_id__in=tenant_ids).select_related("tenant"):
        if grant_in_force(grant, now):
            grants.setdefault((grant.tenant_id, grant.currency), []).append(grant)
    left = wallet_balances_many(tenant_ids=tenant_ids)
    told = []
    for (tenant_id, currency), held in sorted(grants.items()):
        granted = sum(to_minor(g.amount, g.currency) for g in held)
        newest = max(held, key=lambda g: g.pk)
        tenant = newest.tenant
        in_force = {g.pk for g in held}
        remaining = sum(
            b.remaining_minor for b in left.get(tenant_id, []) if b.grant.pk in in_force
        )
        if unbilled and currency == tenant.billing_currency:
            remaining = max(0, remaining - to_minor(unbilled.get(tenant_id, 0), currency))
        if granted <= 0 or remaining * 100 > granted * percent:
            continue
        emitted = event_emit(
            type=EventType.CREDIT_LOW,
            tenant=tenant,
            key=f"credit.low:{tenant_id}:{currency}:{newest.pk}",
            summary=(
                f"{tenant.name}: prepaid credit low, {money_format(remaining, currency)} left "
                f"of {money_format(granted, currency)}"
            ),
            data={
                "currency": currency,
                "remaining_minor": remaining,
                "granted_minor": granted,
                "percent_left": round(remaining * 100 / granted, 2),
                "threshold_percent": percent,
            },
        )
        if emitted is not None:
            told.append(tenant_id)
    return told


def slo_breaches_emit(*, day: date) -> list[str]:
    """slo.breached for every tenant whose service level was missed over
    the UTC `day` (its policy's targets against the ledger's figures)."""
    start = datetime.combine(day, time(), tzinfo=UTC)
    told = []
    for entry in slo_compliance(tenant=None, start=start, end=start + timedelta(days=1)):
        for compliance in entry.days:
            if not compliance.breached:
                continue
            missed = [m for m in compliance.metrics if m.met is False]
            event_emit(
                type=EventType.SLO_BREACHED,
                tenant=entry.tenant,
                key=f"slo.breached:{entry.tenant.pk}:{day.isoformat()}",
                summary=(
                    f"{entry.tenant.name}: service level missed on {day.isoformat()}: "
                    + "; ".join(
                        f"{m.label} {m.measured_text} against {m.target_text}" for m in missed
                    )
                ),
                data={
                    "day": day.isoformat(),
                    "requests": compliance.requests,
                    "missed": [
                        {"metric": m.metric, "measured": str(m.measured), "target": str(m.target)}
                        for m in missed
                    ],
                },
            )
            told.append(entry.tenant.slug)
    return told
