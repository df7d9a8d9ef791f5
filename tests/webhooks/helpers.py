"""What the webhooks tests share: an invoice finalized for a month, and an
endpoint registered through the API as its user would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from billing.invoicing.invoices import invoice_draft_build, invoice_finalize


def invoice_finalized(world, tenant, *, month: int = 9):
    """`tenant`'s invoice for `month` of 2026 (a past month), finalized."""
    start = datetime(2026, month, 1, tzinfo=UTC)
    end = datetime(2026, month + 1, 1, tzinfo=UTC)
    world.tokens(tenant, hour=start + timedelta(hours=1), completion=1_000_000)
    draft, _ = invoice_draft_build(tenant=tenant, period_start=start, period_end=end)
    return invoice_finalize(invoice_id=draft.pk)


def endpoint_post(api, user, url: str, event_types: list[str]):
    """POST /api/v1/webhooks/endpoints as `user`: the answer."""
    api.force_login(user)
    return api.post(
        "/api/v1/webhooks/endpoints",
        {"url": url, "event_types": event_types, "description": "ours"},
        format="json",
    )


def endpoint_registered(api, user, url: str, *event_types: str) -> dict:
    answer = endpoint_post(api, user, url, list(event_types))
    assert answer.status_code == 201, answer.content
    return answer.json()
