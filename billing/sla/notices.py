"""What service levels tell (webhooks.event_emit): a tenant's level missed
over a day, once per tenant and day."""

from __future__ import annotations

from datetime import UTC, date, datetime, time, timedelta

from billing.sla.selectors import slo_compliance
from webhooks.choices import EventType
from webhooks.services import event_emit


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
